"""Which requests prefill at the next step: the prefill slots shared fairly between clients.

The engine prefills at most ``slots`` prompts at once (``prefill.group_limit``: one chunk of
the group feeds at most ``PREFILL_GROUP_TOKENS`` tokens, so a step's prefill work is bounded
whatever is waiting), a chunk of each every step, interleaved with the decode batch's step.
When more prompts want prefill than there are slots, this rule picks which, every step:

- **Round-robin across clients**: client 1's first candidate, client 2's first, …, then
  each client's second, and so on, until ``slots`` are taken. Clients are ordered by their
  oldest candidate (the one submitted first), so the order only changes when requests
  arrive or leave, and a row once chosen stays chosen while nothing changes (no thrash).
- **Within a client**, its candidates in submission order.

A client is what ``GenerationParams.client`` names (the API key's id, else the caller's
address and user agent: ``exo_p2p.api.generation.client_key``); requests without one are one client.
Candidates are the rows prefilling, the rows paused (taken out of the group by this rule
earlier, their KV kept) and the queued requests.

Bounds (``tests/test_fair_share.py``): never more than ``slots`` chosen; every slot used
while candidates remain (work-conserving); each client with ``n`` candidates gets at least
``min(n, slots // clients)`` slots, so with at most ``slots`` clients every client has a row
prefilling within one step of asking: one client's ten long prompts never keep another's
one waiting for their whole prefill. The rule is a pure function of the engine's state, the
same on every rank of an instance (they hold the same requests in the same order), so the
ranks choose alike without a round of their own.

**Lengths apart** (``fed_together``): the prompts picked are fed together in one forward a
chunk only when their lengths are alike (at most ``LENGTH_FACTOR`` × the shortest picked
plus ``LENGTH_SLACK`` tokens): the group's KV is left-padded to its longest row, so a short
prompt fed beside a long one would pay the long one's attention at every chunk and take as
long as it. The longer ones wait, keeping their KV, while the shorter prefill; every
``LONG_TURN``-th prefill step one of them (in turn, ``turn``) is fed a chunk on its own,
so a long prompt always progresses, and a short one waits at most one such chunk every
``LONG_TURN`` of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    """A prompt wanting prefill: its task id, its client's key, its submission order (an
    engine-wide counter: lower was submitted first) and whether it was accepted already
    (prefilling or paused: it holds a batch row) or still waits in the queue."""

    task_id: str
    client: str
    order: int
    accepted: bool = True


def prefill_choice(candidates: Sequence[Candidate], slots: int, new_rows: int | None = None) -> list[str]:
    """The task ids to prefill next, at most ``slots`` (≥ 0), in the rule's priority order
    (module docstring), taking at most ``new_rows`` candidates not yet accepted (the rows the
    decode batch can still take; None: no limit): one the batch has no row for is passed
    over and its slot goes on down the order. Raises ``ValueError`` for a negative ``slots``
    or ``new_rows`` or repeated task ids."""
    if slots < 0 or (new_rows is not None and new_rows < 0):
        raise ValueError(f"slots and new_rows must be >= 0, not {slots} and {new_rows}")
    if len({c.task_id for c in candidates}) != len(candidates):
        raise ValueError("a task id is a candidate twice")
    fresh = len(candidates) if new_rows is None else new_rows
    by_client: dict[str, list[Candidate]] = {}
    for c in sorted(candidates, key=lambda c: c.order):
        if c.accepted or fresh > 0:  # with no new row at all, the new ones are not candidates
            by_client.setdefault(c.client, []).append(c)
    queues = list(by_client.values())  # clients in order of their oldest candidate
    at = [0] * len(queues)
    chosen: list[str] = []
    while len(chosen) < slots:
        took = False
        for k, q in enumerate(queues):
            while at[k] < len(q) and not q[at[k]].accepted and fresh == 0:
                at[k] += 1  # no batch row left for a new one: this client's next
            if at[k] < len(q) and len(chosen) < slots:
                fresh -= 0 if q[at[k]].accepted else 1
                chosen.append(q[at[k]].task_id)
                at[k], took = at[k] + 1, True
        if not took:
            break
    return chosen


LENGTH_FACTOR = 2
"""Prompts fed together are at most this many times as long as the shortest (plus ``LENGTH_SLACK``)."""
LENGTH_SLACK = 256
"""Tokens a prompt fed together may exceed ``LENGTH_FACTOR`` × the shortest by."""
LONG_TURN = 8
"""Every this many prefill steps, a prompt left out for its length is fed a chunk of its own."""


def fed_together(lengths: Sequence[tuple[str, int]]) -> list[str]:
    """Of the picked prompts ``(task id, prompt tokens)``, in order, those fed together: the
    ones at most ``LENGTH_FACTOR`` × the shortest + ``LENGTH_SLACK`` tokens long (module
    docstring); the order kept. Raises ``ValueError`` for a negative length."""
    if any(n < 0 for _, n in lengths):
        raise ValueError("a prompt length is negative")
    if not lengths:
        return []
    limit = LENGTH_FACTOR * min(n for _, n in lengths) + LENGTH_SLACK
    return [t for t, n in lengths if n <= limit]


def turn(left_out: Sequence[str], step: int) -> str | None:
    """The prompt left out for its length (``left_out``, in the rule's order) that is fed a
    chunk of its own at prefill step ``step`` (≥ 0), or None: every ``LONG_TURN``-th step,
    each in turn."""
    if not left_out or step % LONG_TURN != LONG_TURN - 1:
        return None
    return left_out[(step // LONG_TURN) % len(left_out)]


LONG_PROMPT_TOKENS = 2048
"""Prompts longer than this are *long*: while rows decode, the runner may hold their chunks
back to keep the streams' rate (``PrefillSlots.may_feed``, ``worker.runner.prefill_pace``);
shorter ones are interactive turns and are never held."""
