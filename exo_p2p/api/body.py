"""Reading request bodies with a size limit, without holding more than the limit in memory."""

from __future__ import annotations

from contextlib import aclosing

from starlette.requests import Request

from exo_p2p.api.errors import ApiError

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
"""Largest request body accepted (bytes); larger ones get a 413."""
BODY_KEY = "exo_body"
"""Where ``read_body`` leaves the body it read in ``request.state``: the record of a request
refused afterwards names the model it asked for (``exo_p2p.api.generation.rejected``)."""


async def read_body(request: Request, limit: int = DEFAULT_MAX_BODY_BYTES) -> bytes:
    """The request body, at most ``limit`` bytes.

    Raises ``ApiError(413)`` as soon as the declared ``Content-Length`` (ASCII digits; any other
    value is ignored and the bytes are counted) or the bytes received so far exceed ``limit``
    (the rest is never read). Raises starlette's ``ClientDisconnect`` if the client goes away
    mid-body. The body is also kept in ``request.state`` (``BODY_KEY``).
    """
    declared = (request.headers.get("content-length") or "").strip().lstrip("0") or "0"
    # ASCII digits only (isdigit() also takes "²", which int() refuses), and more of them
    # than the limit has is too large without reading them as a number (int() refuses thousands)
    if declared.isascii() and declared.isdigit() and (len(declared) > len(str(limit)) or int(declared) > limit):
        raise _too_large(limit)
    parts: list[bytes] = []
    size = 0
    async with aclosing(request.stream()) as stream:
        async for part in stream:
            size += len(part)
            if size > limit:
                raise _too_large(limit)
            parts.append(part)
    body = b"".join(parts)
    setattr(request.state, BODY_KEY, body)
    return body


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body is larger than the limit of {limit} bytes", code="request_too_large")
