"""How much of a runner's time a long prompt's prefill may take while streams decode
(docs/architecture.md#fairness-between-clients).

Every engine step feeds one chunk of each prompt prefilling and then decodes one token of
each stream. A chunk of a long prompt attending to thousands of tokens of KV can cost 10–30×
a decode step, so the streams would slow to a few tenths of their rate for the whole
prefill. The ``PrefillPacer`` keeps the steps that feed a long prompt (longer than
``fair_share.LONG_PROMPT_TOKENS``; shorter prompts are never held) to about
``PREFILL_SHARE`` of the runner's time while rows decode: every step that only decodes earns
``PREFILL_SHARE / (1 − PREFILL_SHARE)`` of its seconds as credit (at most
``CREDIT_CAP`` seconds), every step that fed a long chunk spends its seconds, and long
chunks are held back while the credit is below zero. With no row decoding nothing is held
and the credit starts again from zero.

The pacer measures wall time, so it is local to a rank; on a multi-rank instance each rank
proposes its hold in the agreement round before the step and the ranks hold when any of them
asks (``worker.engine.agreement``), so they step alike.
"""

from __future__ import annotations

PREFILL_SHARE = 0.3
"""Share of a runner's time long prompts' prefill may take while rows decode (the streams
keep ~0.7 of their rate)."""

CREDIT_CAP = 0.2
"""Seconds of credit at most: a long quiet decode buys one chunk's worth of prefill, not a
burst (measured with a 1 s cap: the burst after a quiet spell kept the streams at 0.5 of
their rate over 6 s instead of 0.7)."""


class PrefillPacer:
    """One rank's credit of long-prefill time (see the module docstring)."""

    def __init__(self, share: float = PREFILL_SHARE, cap: float = CREDIT_CAP) -> None:
        if not 0 < share < 1 or cap < 0:
            raise ValueError(f"share must be in (0, 1) and cap >= 0, not {share} and {cap}")
        self.share, self.cap = share, cap
        self.credit = 0.0

    def note(self, seconds: float, long_fed: bool, decoding: bool) -> None:
        """After a step of ``seconds``: whether it fed a long prompt's chunk and whether rows
        decode now."""
        if not decoding:
            self.credit = 0.0
        elif long_fed:
            self.credit -= max(0.0, seconds)
        else:
            self.credit = min(self.cap, self.credit + max(0.0, seconds) * self.share / (1 - self.share))

    @property
    def hold(self) -> bool:
        """Whether to hold long prompts' chunks back at the next step."""
        return self.credit < 0
