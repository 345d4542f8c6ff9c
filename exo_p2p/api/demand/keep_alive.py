"""Keep-alive values as clients and flags give them (docs/models.md "Placement on demand and
idle unload"), read the way Ollama reads its ``keep_alive``: a number is seconds, a string is
a number of seconds or a Go-style duration (``"5m"``, ``"1h30m"``, ``"250ms"``, ``"-1m"``);
``0`` unloads once the request ends; a negative value keeps the model loaded forever.

``parse_keep_alive`` is pure; a value that does not parse raises ``ValueError`` with the
reason, which the families answer as a 400 in their own shape and the node's flag check as
a start-up error naming ``--keep-alive``.
"""

from __future__ import annotations

import math
import re
from typing import Any

MAX_KEEP_ALIVE = 10 * 365 * 24 * 3600.0
"""Seconds: a longer keep-alive is kept as is up to this bound (ten years), beyond it a 400
(a deadline must stay a finite float in State)."""
MAX_TEXT = 64
"""Characters of a keep-alive string read at most."""
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_keep_alive(value: Any) -> float | None:
    """Seconds of ``value`` (negative: forever, returned as ``-1.0``); None when ``value`` is
    None (not given). Raises ``ValueError`` for anything else: a bool, a non-finite or too
    large number, text that is neither a number nor a duration."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"keep_alive must be a duration such as \"5m\" or a number of seconds, not {type(value).__name__}")
    seconds = float(value) if not isinstance(value, str) else _text_seconds(value)
    if not math.isfinite(seconds):
        raise ValueError("keep_alive must be a finite number of seconds")
    if seconds < 0:
        return -1.0
    if seconds > MAX_KEEP_ALIVE:
        raise ValueError(f"keep_alive of {seconds:g} s is longer than {MAX_KEEP_ALIVE:g} s; use a negative value to keep it forever")
    return seconds


def _text_seconds(text: str) -> float:
    """Seconds of a keep-alive string (a number, or a duration with units)."""
    raw = text.strip()
    if len(raw) > MAX_TEXT or not raw:
        raise ValueError(f"keep_alive {text[:MAX_TEXT]!r} is not a duration such as \"5m\", \"1h30m\" or a number of seconds")
    try:
        return float(raw)
    except ValueError:
        pass
    sign = -1.0 if raw.startswith("-") else 1.0
    body = raw.lstrip("+-")
    parts = _PART.findall(body)
    if not parts or "".join(n + u for n, u in parts) != body:
        raise ValueError(f"keep_alive {raw!r} is not a duration such as \"5m\", \"1h30m\" or a number of seconds")
    return sign * sum(float(n) * _UNITS[u] for n, u in parts)


def describe(seconds: float | None) -> str:
    """``seconds`` of keep-alive for people: ``forever``, ``unload when idle``, ``5m``, ``90s``."""
    if seconds is None or seconds < 0:
        return "forever"
    if seconds == 0:
        return "unload when idle"
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"
