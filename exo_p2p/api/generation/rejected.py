"""The record of a generation request refused before it became a job: a body that does not
decode or fails the family's checks (400), one too large (413). Such a request never reaches
``exo_p2p.api.generation.path`` (whose trace records the refusals that come later: an unknown
model's 404, a full queue's 429), so the API's error handler records it here: ``exo-p2p logs
requests`` and ``exo_requests_total`` count every answered generation request
(docs/operations.md).
"""

from __future__ import annotations

import time

import msgspec
from starlette.requests import Request

from exo_p2p.api.body import BODY_KEY
from exo_p2p.api.errors import ApiError, family_of
from exo_p2p.types import new_id
from exo_p2p.types.observe import RequestRecord

GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
                              "/api/chat", "/api/generate"})
"""The POST endpoints whose requests are generations (each family's routes)."""
MAX_MODEL_CHARS = 200
"""Characters of a client's model name a record keeps."""


class _ModelOnly(msgspec.Struct):
    model: str = ""


def asked_model(body: object) -> str:
    """The ``model`` string of a JSON object body (cut to ``MAX_MODEL_CHARS``), ``""`` when
    there is none or the body does not decode (nested too deeply included)."""
    if not isinstance(body, bytes):
        return ""
    try:
        return msgspec.json.decode(body, type=_ModelOnly).model[:MAX_MODEL_CHARS]
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return ""


def rejected_record(request: Request, exc: ApiError) -> RequestRecord | None:
    """The record of a generation request answered ``exc`` by the error handler, or None
    when ``request`` is not a generation (``GENERATION_PATHS``). Its outcome is ``refused``,
    its duration 0 (nothing was run), its id fresh (no task was made)."""
    if request.method != "POST" or request.url.path not in GENERATION_PATHS:
        return None
    body = getattr(request.state, BODY_KEY, None)
    return RequestRecord(request_id=new_id(), family=family_of(request.url.path), model=asked_model(body),
                         status=exc.info.status, outcome="refused", started=round(time.time(), 3), duration=0.0,
                         key_id=(request.scope.get("state") or {}).get("api_key_id"))
