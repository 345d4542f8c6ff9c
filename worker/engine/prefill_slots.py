"""The prompts accepted and still prefilling: the ``PrefillGroup`` and the rows paused.

The engine prefills the prompts ``fair_share.prefill_choice`` picks, at most
``prefill.group_limit`` at once, as one ``PrefillGroup`` (one forward a chunk). A row
prefilling that the rule no longer picks (another client's request took its slot) is
*paused*: taken out of the group with its KV so far (``PrefillGroup.take_out``), kept here,
and added back to the group when the rule picks it again, going on from where it was. A
paused row keeps its batch row and its KV (the engine's memory check counts it), so resuming
never waits for memory. Every rank makes the same moves in the same order (the rule is a pure
function of state the ranks share).
"""

from __future__ import annotations

from typing import Any

from worker.engine.fair_share import Candidate, prefill_choice
from worker.engine.prefill import PrefillGroup, group_limit
from worker.engine.sequence import Sequence
from worker.engine.task_queue import Queued


def client_of(seq_or_params: object) -> str:
    """The fairness key of a request (``GenerationParams.client``; "" for none)."""
    params = getattr(seq_or_params, "params", seq_or_params)
    return getattr(params, "client", None) or ""


class PrefillSlots:
    """The group prefilling (``group``, None for none) and the paused rows (``paused``, in
    the order they were paused), with each accepted row's submission order (``accept``)."""

    def __init__(self) -> None:
        self.group: PrefillGroup | None = None
        self.paused: list[Sequence] = []
        self._order: dict[str, int] = {}

    @property
    def rows(self) -> list[Sequence]:
        """Every accepted sequence not yet in the decode batch: the group's rows, then the paused."""
        return (self.group.rows if self.group is not None else []) + self.paused

    def accept(self, seq: Sequence, order: int) -> None:
        """Note ``seq``'s submission order as it is accepted (before ``add``)."""
        self._order[seq.task_id] = order

    def candidates(self) -> list[Candidate]:
        """The rows as the fairness rule's candidates (accepted ones)."""
        return [Candidate(s.task_id, client_of(s), self._order.get(s.task_id, -1)) for s in self.rows]

    def choice(self, queued: list[Queued], free_rows: int, chunk_size: int) -> list[str]:
        """The fairness rule's pick for the next chunk: among the rows here and the
        ``queued`` requests, at most ``group_limit(chunk_size, free_rows)``, queued ones only
        while the decode batch's ``free_rows`` (rows it can still take) exceed the rows here."""
        new_rows = max(0, free_rows - len(self.rows))
        fresh = [Candidate(q.task_id, client_of(q.params), q.order, accepted=False) for q in queued] if new_rows else []
        return prefill_choice(self.candidates() + fresh, group_limit(chunk_size, free_rows), new_rows)

    def pause_except(self, chosen: set[str]) -> None:
        """Pause the group's rows not in ``chosen`` (their KV taken out of the group's)."""
        group = self.group
        if group is None:
            return
        for seq in [s for s in group.rows if s.task_id not in chosen]:
            if group.take_out(seq):
                self.group = None
            self.paused.append(seq)

    def resume(self, chosen: list[str]) -> list[Sequence]:
        """Take the paused rows in ``chosen`` out of ``paused``, in ``chosen``'s order (to be
        ``add``-ed back)."""
        by_id = {s.task_id: s for s in self.paused}
        back = [by_id[t] for t in chosen if t in by_id]
        self.paused = [s for s in self.paused if all(s is not b for b in back)]
        return back

    def add(self, seqs: list[Sequence]) -> None:
        """``seqs`` (just accepted or resumed) join the group prefilling, or form one."""
        if not seqs:
            return
        if self.group is not None:
            self.group.add(seqs)
        else:
            self.group = PrefillGroup(seqs)

    def discard(self, seq: Sequence) -> None:
        """``seq`` leaves (cancelled, failed, or in the batch now): its KV rows freed."""
        self._order.pop(seq.task_id, None)
        self.paused = [s for s in self.paused if s is not seq]
        if self.group is not None and self.group.discard(seq):
            self.group = None

    def join(self, done: PrefillGroup, batch: Any) -> None:
        """``done``'s rows, prefilled, join ``batch`` (a ``DecodeBatch``); the group
        prefilling ends when it is ``done``."""
        for s in done.rows:
            self._order.pop(s.task_id, None)
        done.join(batch)
        if done is self.group:
            self.group = None
