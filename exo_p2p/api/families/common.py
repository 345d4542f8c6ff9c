"""Rules every API family shares: refusing a parameter by name, checking sampling values,
and the SSE framing.

Pure; raises ``ApiError(400, param=…)`` naming the parameter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from exo_p2p.api.errors import ApiError

LOGIT_BIAS_LIMIT = 100.0
"""Largest absolute logit bias (OpenAI's range is -100..100; -100 bans a token)."""

_json = msgspec.json.Encoder()


def refuse(param: str, why: str) -> ApiError:
    """The 400 of a parameter we cannot honour: "unsupported parameter 'x': why"."""
    return ApiError(400, f"unsupported parameter '{param}': {why}", param=param, code="unsupported_parameter")


def refuse_set(checks: Iterable[tuple[str, bool, str]]) -> None:
    """Raise ``refuse(param, why)`` for the first ``(param, is_set, why)`` that is set."""
    for param, is_set, why in checks:
        if is_set:
            raise refuse(param, why)


def check_range(param: str, value: float | int | None, low: float, high: float, *, low_open: bool = False) -> None:
    """400 unless ``value`` is None or within ``[low, high]`` (``(low, high]`` when ``low_open``)."""
    if value is None:
        return
    if value < low or value > high or (low_open and value == low):
        left = "(" if low_open else "["
        raise ApiError(400, f"{param} must be in {left}{low:g}, {high:g}], got {value}", param=param)


def logit_bias_pairs(bias: Mapping[str, Any] | None, param: str = "logit_bias") -> tuple[tuple[int, float], ...]:
    """OpenAI's ``{"token id": bias}`` as ``((id, bias), …)`` sorted by id; 400 for a key that
    is not a non-negative integer or a bias that is not a number in [-100, 100]."""
    if not bias:
        return ()
    pairs: list[tuple[int, float]] = []
    for key, value in bias.items():
        if not (isinstance(key, str) and key.strip().isdigit()):
            raise ApiError(400, f"{param} keys must be token ids (non-negative integers as strings), got {key[:40]!r}", param=param)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -LOGIT_BIAS_LIMIT <= value <= LOGIT_BIAS_LIMIT:
            raise ApiError(400, f"{param}[{key}] must be a number in [-100, 100], got {value!r:.40}", param=f"{param}.{key}")
        pairs.append((int(key), float(value)))
    return tuple(sorted(pairs))


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    """Stop strings from a string or a list (any number); empty strings dropped, order kept."""
    items = [stop] if isinstance(stop, str) else (stop or [])
    return tuple(s for s in dict.fromkeys(items) if s)


def sse(payload: object, event: str | None = None) -> bytes:
    """One SSE event: ``event: NAME`` (when given) and ``data: <payload as JSON>``."""
    data = payload if isinstance(payload, bytes) else _json.encode(payload)
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + data + b"\n\n"


SSE_KEEPALIVE = b": keep-alive\n\n"
"""An SSE comment: clients ignore it, proxies see bytes."""
SSE_MEDIA_TYPE = "text/event-stream"
