"""Rules every API family shares: refusing a parameter by name, checking sampling values,
and the SSE framing.

Pure; raises ``ApiError(400, param=…)`` naming the parameter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from exo_p2p.api.bounds import MAX_LOGIT_BIAS_ENTRIES, MAX_TOKEN_ID_DIGITS, check_stop
from exo_p2p.api.errors import ApiError
from exo_p2p.api.schemas import TOKEN_ID_LIMIT

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
    """OpenAI's ``{"token id": bias}`` as ``((id, bias), …)`` sorted by id; 400 for more than
    ``MAX_LOGIT_BIAS_ENTRIES`` entries, a key that is not a non-negative integer (its length is
    checked before it is read) or a bias that is not a number in [-100, 100]."""
    if not bias:
        return ()
    if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise ApiError(400, f"{param} has {len(bias)} entries; at most {MAX_LOGIT_BIAS_ENTRIES} are accepted", param=param)
    pairs: list[tuple[int, float]] = []
    for key, value in bias.items():
        digits = key.strip() if isinstance(key, str) else ""
        # ASCII digits only: str.isdigit() also takes "²", which int() refuses; and at most
        # MAX_TOKEN_ID_DIGITS of them, as int() refuses thousands
        if not (digits.isascii() and digits.isdigit() and len(digits) <= MAX_TOKEN_ID_DIGITS and int(digits) <= TOKEN_ID_LIMIT):
            raise ApiError(400, f"{param} keys must be token ids (integers in [0, {TOKEN_ID_LIMIT}] as strings), "
                           f"got {str(key)[:40]!r}", param=param)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -LOGIT_BIAS_LIMIT <= value <= LOGIT_BIAS_LIMIT:
            raise ApiError(400, f"{param}[{key}] must be a number in [-100, 100], got {value!r:.40}", param=f"{param}.{key}")
        pairs.append((int(digits), float(value)))
    return tuple(sorted(pairs))


def stop_strings(stop: str | list[str] | None, param: str = "stop") -> tuple[str, ...]:
    """Stop strings from a string or a list; empty strings and duplicates dropped, order kept.
    400 beyond ``MAX_STOP_STRINGS`` strings or ``MAX_STOP_BYTES`` bytes of one
    (``exo_p2p.api.bounds.check_stop``)."""
    items = [stop] if isinstance(stop, str) else (stop or [])
    return check_stop(items, param)


_LINE_BREAKS_JSON_KEEPS = ((b"\xc2\x85", b"\\u0085"), (b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"))
"""Characters JSON may carry raw but line splitters such as Python's ``str.splitlines`` break
on (NEL, LINE SEPARATOR, PARAGRAPH SEPARATOR), as UTF-8 bytes and their JSON escapes; msgspec
already escapes every control character below U+0020."""


def one_line_json(payload: object) -> bytes:
    """``payload`` as JSON bytes (bytes are taken as JSON already) that stay one line for any
    line splitter: U+0085, U+2028 and U+2029 escaped as ``\\uXXXX`` (the same JSON value). Every
    SSE ``data:`` line and NDJSON line is made with this, so a client splitting on those
    characters never sees half an event."""
    data = payload if isinstance(payload, bytes) else _json.encode(payload)
    for raw, escaped in _LINE_BREAKS_JSON_KEEPS:
        if raw in data:
            data = data.replace(raw, escaped)
    return data


def sse(payload: object, event: str | None = None) -> bytes:
    """One SSE event: ``event: NAME`` (when given) and ``data: <payload as JSON on one line>``
    (``one_line_json``)."""
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + one_line_json(payload) + b"\n\n"


SSE_KEEPALIVE = b": keep-alive\n\n"
"""An SSE comment: clients ignore it, proxies see bytes."""
SSE_MEDIA_TYPE = "text/event-stream"
