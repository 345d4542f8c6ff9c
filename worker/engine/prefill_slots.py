"""The prompts accepted and still prefilling: the ``PrefillGroup`` and the rows paused.

The engine prefills the prompts ``fair_share.prefill_choice`` picks, at most
``prefill.group_limit`` at once, as one ``PrefillGroup`` (one forward a chunk). A row
prefilling that the rule no longer picks (another client's request took its slot) is
*paused*: taken out of the group with its KV so far (``PrefillGroup.take_out``), kept here,
and added back to the group when the rule picks it again, going on from where it was. A
paused row keeps its batch row and its KV (the engine's memory check counts it), so resuming
never waits for memory. Of the prompts picked, only those of alike lengths form the group
(``fair_share.fed_together``); the longer ones stay paused (``left_out``) and are fed a chunk
on their own in turn (``next_turn``). A paused row holds its own cache, so moving it in and
out between steps copies nothing; only taking a row out of a merged group copies its KV. Every rank makes the same moves in the same order (the rule is a pure
function of state the ranks share).
"""

from __future__ import annotations

from typing import Any

from worker.engine.fair_share import LONG_PROMPT_TOKENS, Candidate, fed_together, prefill_choice, turn
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
        self.left_out: list[str] = []  # picked, but paused for their length (``fed_together``)
        self.steps = 0  # prefill steps so far (``next_turn``)
        self.hold_long = False  # set by the runner: hold long prompts' chunks back this step (``may_feed``)
        self.long_fed = False  # whether this step fed a long prompt's chunk (the engine resets it)
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

    def arrange(self, chosen: list[str], incoming: list[Sequence]) -> None:
        """After ``pause_except(chosen)``: of the group's rows and ``incoming`` (just
        accepted or resumed, their own caches), those of alike lengths form the group (in
        ``chosen``'s order), the others are paused and ``left_out``."""
        live = {s.task_id: s for s in (self.group.rows if self.group is not None else []) + incoming}
        together = set(fed_together([(t, int(live[t].prompt.size)) for t in chosen if t in live]))
        self.left_out = [t for t in chosen if t in live and t not in together]
        self.pause_except(together)
        self.paused += [s for s in incoming if s.task_id not in together]
        self.add([s for s in incoming if s.task_id in together])

    def add(self, seqs: list[Sequence]) -> None:
        """``seqs`` (just accepted or resumed) join the group prefilling, or form one."""
        if not seqs:
            return
        if self.group is not None:
            self.group.add(seqs)
        else:
            self.group = PrefillGroup(seqs)

    def may_feed(self, rows: list[Sequence], decoding: bool) -> bool:
        """Whether a chunk of ``rows`` is fed this step: not when they are all longer than
        ``LONG_PROMPT_TOKENS``, rows decode and the runner holds long prompts back
        (``hold_long``, the same on every rank); notes ``long_fed`` when it feeds them."""
        long = bool(rows) and min(int(s.prompt.size) for s in rows) > LONG_PROMPT_TOKENS
        if long and decoding and self.hold_long:
            return False
        self.long_fed = self.long_fed or long
        return True

    def next_turn(self) -> Sequence | None:
        """Count a prefill step; the paused row left out for its length that is fed a chunk
        on its own this step (``fair_share.turn``), or None."""
        self.steps += 1
        task_id = turn(self.left_out, self.steps - 1)
        return next((s for s in self.paused if s.task_id == task_id), None)

    def join_alone(self, seq: Sequence, batch: Any) -> None:
        """``seq``, paused and fed on its own, joins ``batch`` once prefilled."""
        if not seq.prefilled:
            return
        self.paused = [s for s in self.paused if s is not seq]
        self.left_out = [t for t in self.left_out if t != seq.task_id]
        self._order.pop(seq.task_id, None)
        batch.join(seq)

    def discard(self, seq: Sequence) -> None:
        """``seq`` leaves (cancelled, failed, or in the batch now): its KV rows freed."""
        self._order.pop(seq.task_id, None)
        self.paused = [s for s in self.paused if s is not seq]
        self.left_out = [t for t in self.left_out if t != seq.task_id]
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
