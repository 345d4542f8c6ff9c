"""A thinking budget: a row reasons for at most ``GenerationParams.thinking_budget`` tokens.

Reasoning tokens are the tokens a row generates inside a think block: the output parser
(``output_parser.OutputParser``) is in its ``reasoning`` state before and after the token's
text (the markers themselves are not counted). When a block opens (or the prompt already
opened it) the budget decides the draw at which the end-of-reasoning marker's tokens are
forced (``Sampler.forced``): the model then writes its answer after the marker, as if it had
closed the block itself.

Why a draw index and not "now": decode runs one step ahead (``batch``: the next token's
draw is queued before this one is read), so a rule applied when a token is read would act
one token late. Scheduling ``budget`` draws after the block opened keeps the count exact:
``budget`` reasoning tokens, then the marker. A block the model closes itself unschedules
what is not queued yet; the one draw already queued may still emit the marker once more, in
the answer (the model closed its block exactly one token before its budget ran out).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from worker.engine.sampling import Sampler


@dataclass
class ThinkBudget:
    """One row's budget: ``budget`` (≥ 1) reasoning tokens, then ``end_ids`` (the
    end-of-reasoning marker's token ids) forced. ``used``: reasoning tokens so far (replayed
    ones of a resumed request included); ``read``: draws of this task read so far."""

    budget: int
    end_ids: tuple[int, ...]
    used: int = 0
    read: int = 0
    scheduled: bool = False

    def __post_init__(self) -> None:
        if self.budget < 1 or not self.end_ids:
            raise ValueError(f"a thinking budget needs budget >= 1 and a marker (budget {self.budget})")

    def start(self, sampler: Sampler, reasoning: bool) -> None:
        """Before the first draw: when the row starts inside a think block, its marker is
        forced at the draw that would exceed the budget (what replay ``used`` counted
        included)."""
        if reasoning:
            self._schedule(sampler, max(0, self.budget - self.used))

    def replayed(self, before: str, after: str) -> None:
        """A resumed request's already-sent token, which moved the parser from ``before`` to
        ``after``: counted, nothing scheduled (``start`` follows)."""
        if before == after == "reasoning":
            self.used += 1

    def consumed(self, sampler: Sampler, before: str, after: str) -> None:
        """The draw just read moved the parser from state ``before`` to ``after``: count it,
        schedule the marker when a block opened, unschedule it when the model closed it."""
        d = self.read
        self.read += 1
        if before == after == "reasoning":
            self.used += 1
        if after == "reasoning" and not self.scheduled:
            self._schedule(sampler, d + 1 + max(1, self.budget - self.used))
        elif after != "reasoning" and self.scheduled:
            self.scheduled = False
            for index in [i for i in sampler.forced if i > d + 1]:
                del sampler.forced[index]

    def _schedule(self, sampler: Sampler, at: int) -> None:
        self.scheduled = True
        for i, token in enumerate(self.end_ids):
            sampler.forced[at + i] = token


def end_marker_ids(tokenizer: object, think_end: str | None, single: int | None) -> tuple[int, ...]:
    """The end-of-reasoning marker's token ids: ``single`` (the tokenizer's own
    ``think_end_id``) when known, else ``think_end`` encoded without special tokens; empty
    when the model has no marker."""
    if single is not None:
        return (single,)
    if not think_end:
        return ()
    ids: Sequence[int] = tokenizer.encode(think_end, add_special_tokens=False)  # type: ignore[attr-defined]
    return tuple(int(i) for i in ids)
