"""How many tokens a row drafts next: adaptive per row from its acceptance, off when low.

The rule (pure state, one per row): ``k`` starts at ``START_K`` (at most ``max_k``); a step
whose proposals were all accepted doubles it (at most ``max_k``: a row copying a long
span reaches long drafts in a few steps), one with none accepted
halves it (at least 1). On this CPU a verification pass of ``1 + k`` positions costs more
than one position (docs/benchmarks.md), so ``k`` grows only while drafts are right. Once the row has proposed ``WINDOW`` tokens its acceptance over them is judged: below
``MIN_ACCEPTANCE`` the row stops drafting for ``backoff`` steps (starting at ``BACKOFF``,
doubling each time it is turned off again, at most ``MAX_BACKOFF``), then tries again with a
fresh window. Rejected drafts cost the row extra positions of the forward pass and a KV
rollback, so a row whose drafts are mostly wrong stops paying for them (docs/benchmarks.md
"Speculative decoding").
"""

from __future__ import annotations

START_K = 2
"""Drafts a row proposes at first, and again after a pause."""
WINDOW = 16
"""Proposed tokens over which a row's acceptance is judged."""
MIN_ACCEPTANCE = 0.25
"""Accepted ÷ proposed below which a row stops drafting for a while."""
BACKOFF = 32
"""Decode steps a row drafts nothing after its acceptance was judged low the first time."""
MAX_BACKOFF = 1024
"""The longest pause (steps) after repeated low acceptance."""


class DraftPolicy:
    """One row's drafting state. ``max_k`` ≥ 1 (``--num-draft``); ``ValueError`` otherwise."""

    def __init__(self, max_k: int) -> None:
        if max_k < 1:
            raise ValueError(f"max_k must be >= 1, not {max_k}")
        self.max_k = max_k
        self.k = min(START_K, max_k)
        self.proposed = 0  # in the current window
        self.accepted = 0
        self.paused = 0  # steps left without drafting
        self.backoff = BACKOFF

    def wanted(self) -> int:
        """Tokens to draft this step (0 while paused; counts the paused step)."""
        if self.paused > 0:
            self.paused -= 1
            return 0
        return self.k

    def record(self, proposed: int, accepted: int) -> None:
        """A verification of ``proposed`` (≥ 1) drafts of which ``accepted`` were accepted."""
        if proposed <= 0:
            return
        self.proposed += proposed
        self.accepted += accepted
        if accepted == proposed:
            self.k = min(self.max_k, self.k * 2)
        elif accepted == 0:
            self.k = max(1, self.k // 2)
        self._judge()

    def miss(self) -> None:
        """A step that wanted drafts and found none (its next token was read early for
        nothing, ``verify.py``): counted as one rejected draft in the window, ``k`` kept, so a
        row whose look-ups keep failing (free prose) pauses as one whose drafts do."""
        self.proposed += 1
        self._judge()

    def _judge(self) -> None:
        if self.proposed >= WINDOW:
            if self.accepted < MIN_ACCEPTANCE * self.proposed:
                self.paused, self.backoff = self.backoff, min(MAX_BACKOFF, self.backoff * 2)
                self.k = min(START_K, self.max_k)
            self.proposed = self.accepted = 0
