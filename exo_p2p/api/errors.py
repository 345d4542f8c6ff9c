"""OpenAI-shaped error answers (``{"error": {"message", "type", "param", "code"}}``) with the
status codes of docs/architecture.md#instance-lifecycle, and the decoding edge where request bytes become Structs.

Every error the API answers goes through ``error_response``; request-body problems are raised
as ``ApiError`` by ``decode_json`` and turned into 400s by the route.
"""

from __future__ import annotations

import re
from typing import Literal, TypeVar

import msgspec
from starlette.responses import Response

from exo_p2p.api.schemas import ErrorBody, ErrorDetail
from exo_p2p.types import ErrorInfo

T = TypeVar("T")

RETRY_AFTER_LOADING_S = 5
"""``Retry-After`` (seconds) on a 503 for a model that is still loading (docs/architecture.md#instance-lifecycle)."""

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}
_json = msgspec.json.Encoder()
_PATH_RE = re.compile(r" - at `\$\.?(.*)`$")
_MISSING_RE = re.compile(r"^Object missing required field `([^`]+)`")


class ApiError(Exception):
    """An error answer raised inside a route: becomes ``error_response(self.info)``."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.info = error_info(status, message, param=param, code=code)


def error_info(status: int, message: str, *, param: str | None = None, code: str | None = None) -> ErrorInfo:
    """An ``ErrorInfo`` with the OpenAI error type for ``status`` (5xx → ``server_error``)."""
    kind = _TYPE_BY_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return ErrorInfo(status=status, message=message, type=kind, param=param, code=code)


OVERFLOW_CODE = "context_length_exceeded"


def overflow_message(family: str, info: ErrorInfo) -> str:
    """``info``'s message, or for a prompt that does not fit the context (``code``
    ``context_length_exceeded`` with its token counts) the words its family's vendor uses, which
    agents match to compact a conversation: OpenAI's "This model's maximum context length is M
    tokens. However, your messages resulted in N tokens. …", Anthropic's "prompt is too long:
    N tokens > M maximum", Ollama's "the input length exceeds the context length"."""
    n, m = info.prompt_tokens, info.context_tokens
    if info.code != OVERFLOW_CODE or n is None or m is None:
        return info.message
    if family == "anthropic":
        return f"prompt is too long: {n} tokens > {m} maximum"
    if family == "ollama":
        return "the input length exceeds the context length"
    return (f"This model's maximum context length is {m} tokens. However, your messages resulted in {n} tokens. "
            "Please reduce the length of the messages.")


def error_body(info: ErrorInfo) -> bytes:
    """The JSON bytes of an OpenAI-shaped error body for ``info`` (an overflow worded as
    OpenAI does, ``overflow_message``)."""
    return _json.encode(ErrorBody(ErrorDetail(overflow_message("openai", info), info.type, info.param, info.code)))


def should_not_retry(info: ErrorInfo) -> bool:
    """Whether retrying the same request cannot help: every 4xx but 408 and 429 (bad
    request, auth, not found, not placed, too large, wrong media type), and a 503
    ``out_of_memory``. Such errors carry ``x-should-retry: false``, which the OpenAI and
    Anthropic SDKs obey (they would otherwise retry a 409 twice)."""
    if 400 <= info.status < 500:
        return info.status not in (408, 429)
    return info.status == 503 and info.code == "out_of_memory"


def error_headers(info: ErrorInfo) -> dict[str, str]:
    """Extra headers for an error: ``Retry-After`` on a 503 while the model is loading
    (``code == "loading"``, or a message that says "loading" when the master set no code) or
    its placement on demand waits for instances serving a request (``placement_busy``);
    ``x-should-retry: false`` when ``should_not_retry``."""
    if info.status == 503 and (info.code in ("loading", "placement_busy") or (info.code is None and "loading" in info.message.lower())):
        return {"retry-after": str(RETRY_AFTER_LOADING_S)}
    if should_not_retry(info):
        return {"x-should-retry": "false"}
    return {}


def error_response(info: ErrorInfo, headers: dict[str, str] | None = None) -> Response:
    """A JSON response of ``info`` with its status (out-of-range statuses become 500)."""
    status = info.status if 400 <= info.status <= 599 else 500
    all_headers = {**error_headers(info), **(headers or {})}
    return Response(error_body(info), status_code=status, headers=all_headers, media_type="application/json")


Family = Literal["openai", "anthropic", "ollama"]
"""The API families served; each has its own error shape."""

_ANTHROPIC_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def family_of(path: str) -> Family:
    """The API family a path belongs to: ``/v1/messages…`` is Anthropic, ``/api/…`` and
    ``/`` are Ollama, everything else is OpenAI-shaped (including the cluster endpoints)."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return "anthropic"
    if path == "/" or path.startswith("/api/"):
        return "ollama"
    return "openai"


def anthropic_error_body(info: ErrorInfo) -> bytes:
    """``{"type": "error", "error": {"type", "message"}}`` (Anthropic's error shape; an
    overflow worded as Anthropic does, ``overflow_message``)."""
    kind = _ANTHROPIC_TYPE_BY_STATUS.get(info.status, "api_error" if info.status >= 500 else "invalid_request_error")
    return _json.encode({"type": "error", "error": {"type": kind, "message": overflow_message("anthropic", info)}})


def ollama_error_body(info: ErrorInfo) -> bytes:
    """``{"error": "message"}`` (Ollama's error shape)."""
    return _json.encode({"error": overflow_message("ollama", info)})


def family_error_body(family: str, info: ErrorInfo) -> bytes:
    """The error body of ``info`` in ``family``'s shape."""
    if family == "anthropic":
        return anthropic_error_body(info)
    if family == "ollama":
        return ollama_error_body(info)
    return error_body(info)


def family_error_response(family: str, info: ErrorInfo, headers: dict[str, str] | None = None) -> Response:
    """``error_response`` in ``family``'s error shape (status and headers the same)."""
    status = info.status if 400 <= info.status <= 599 else 500
    all_headers = {**error_headers(info), **(headers or {})}
    return Response(family_error_body(family, info), status_code=status, headers=all_headers, media_type="application/json")


def decode_json(body: bytes, type_: type[T]) -> T:
    """Decode a request body into ``type_``.

    Raises ``ApiError(400)`` with msgspec's message, which names the field
    (e.g. "Expected `int`, got `str` - at `$.max_tokens`", param ``max_tokens``), for
    malformed JSON, invalid UTF-8, wrong types, out-of-range values and nesting too deep.
    """
    if not body or body.isspace():
        raise ApiError(400, "request body is empty: expected a JSON object")
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        message = str(exc)
        match = _PATH_RE.search(message)
        param = (match.group(1) or None) if match else None
        if (missing := _MISSING_RE.match(message)) is not None:
            # "Object missing required field `model`" names the field itself: the param is
            # that field under the path (``inner.model``), not the object holding it
            param = f"{param}.{missing.group(1)}" if param else missing.group(1)
        raise ApiError(400, message, param=param) from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"invalid JSON body: {exc}") from None
    except RecursionError:
        raise ApiError(400, "invalid JSON body: nested too deeply") from None
