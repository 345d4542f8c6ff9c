"""JSON read from a model source (a hub repo, a model directory, a safetensors header): a
model's files are as untrusted as a client's request (docs/security.md#model-sources)."""

from __future__ import annotations

import json
from typing import Any

from exo_p2p.content.json_depth import json_depth
from exo_p2p.models.errors import UnsupportedModelError

MAX_MODEL_JSON_DEPTH = 32
"""Arrays and objects nested in a model's ``config.json`` or a safetensors header at most (real
ones nest 2 to 5 deep: ``text_config.rope_scaling``, a header's ``shape`` lists)."""


def model_json(data: str | bytes, what: str) -> Any:
    """``data`` decoded as JSON. Raises ``UnsupportedModelError`` naming ``what`` (a file, e.g.
    ``"org/m: config.json"``) when it is not JSON or nests deeper than
    ``MAX_MODEL_JSON_DEPTH`` (measured without recursion; JSON deep enough to exhaust Python's
    recursion is refused the same way)."""
    try:
        value = json.loads(data)
    except RecursionError:
        value = None
        deep = True
    except ValueError as e:
        raise UnsupportedModelError(f"{what} is not JSON ({e})") from e
    else:
        deep = json_depth(value) > MAX_MODEL_JSON_DEPTH
    if deep:
        raise UnsupportedModelError(f"{what} nests arrays and objects deeper than {MAX_MODEL_JSON_DEPTH} levels")
    return value
