"""How often the ranks of a multi-rank runner agree (docs/architecture.md#rules).

The runner (``worker.runner.main``) runs an agreement round before each step that accepts or
prefills, every ``check_every`` decode steps, and every ``IDLE_ROUND_INTERVAL`` seconds when
idle. ``check_every`` is re-agreed at every round from each rank's measured decode rate (the
smallest proposal wins), so a cancel is acted on within about ``CHECK_SECONDS`` of decode
even when decode slows down after warm-up (tests/test_cancel.py).
"""

from __future__ import annotations

IDLE_ROUND_INTERVAL = 0.1
"""Seconds between agreement rounds while a multi-rank runner is idle (bounds how long a new
request waits before every rank has agreed on it, plus delivery skew)."""

CHECK_SECONDS = 1.0
"""Target seconds of decode between agreement rounds (docs/architecture.md#rules: a check at least every ~2 s;
1 s leaves room for decode slowing down between two rounds, and a round — one all-gather of
a few hundred bytes — costs about a millisecond)."""

MAX_CHECK_EVERY = 16
"""Most decode steps between agreement rounds, however fast decode is. Small because the pace
is measured on the last interval and decode can slow down ~10× at once when other processes
take the CPU: 64 steps measured at 100 tokens/s then took over 10 s (a cancel waited that
long). A round costs about one pipeline hop, so 1/16 of a step's communication."""


BATCH_CHECK_SECONDS = 0.25
"""``CHECK_SECONDS`` of an instance that batches (``max_batch`` > 1): a request arriving while
others decode joins only after the next round has agreed on it, so rounds come 4× as often
(measured on a 2-node pipeline, 8 streams decoding: a joining request's TTFT was 4.4× its
TTFT alone with rounds ~1 s apart; the target is ≤ 2×)."""


def round_seconds(max_batch: int) -> float:
    """Target seconds of decode between agreement rounds for an instance batching up to
    ``max_batch`` sequences."""
    return BATCH_CHECK_SECONDS if max_batch > 1 else CHECK_SECONDS


def check_every_for(decode_tokens_per_second: float, seconds: float = CHECK_SECONDS) -> int:
    """Decode steps between agreement rounds so a round comes every ``seconds`` at the
    measured rate (steps per second): ``1 ≤ n ≤ MAX_CHECK_EVERY``."""
    return max(1, min(MAX_CHECK_EVERY, int(seconds * decode_tokens_per_second)))
