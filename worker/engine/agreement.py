"""Task agreement between the ranks of one instance (docs/architecture.md#rules).

A rank may receive generation tasks in another order than its peers, or not yet at all, and
a cancel may reach only some ranks. Before a rank starts work it all-gathers what it holds:
the ids of its pending tasks, the ids it wants cancelled, and whether it wants to shut down.
Every rank then decides the same thing from the same gathered rows:

- **start** the tasks every rank has pending, in the master's ``TaskCreated`` order
  (``created_idx``, ties by task id); the rest wait for a later round;
- **cancel** every task any rank wants cancelled (the union), so all ranks stop it at the same
  step;
- **shut down** when any rank was told to;
- **pace**: the decode steps until the next round, the smallest of the ranks' proposals
  (each rank proposes from its own measured decode rate), so the rounds keep coming every
  ~``CHECK_SECONDS`` even when decode slows down under load, and every rank counts the same;
- **hold** long prompts' prefill chunks back at the next step when any rank asks (each asks
  from its own ``worker.runner.prefill_pace.PrefillPacer``), so all ranks feed alike.

``agree(view, all_gather)`` is that rule as one pure function with the collective injected;
the runner passes the MLX ring's all-gather, the unit tests a simulated one. ``TaskAgreement``
keeps one rank's side (pending tasks, cancel wishes, cancelled tombstones) between rounds.

Every rank must call ``agree`` the same number of times in the same order (it is a
collective): the runner calls it at points that are identical on every rank (between prefill
chunks, every N decode steps, and on an idle tick when nothing runs), never conditionally on
local state.

Ids travel as fixed-size ``int64`` rows: a task id becomes a 63-bit key (sha256); at most
``MAX_SLOTS`` pending tasks and ``MAX_SLOTS`` cancel wishes per rank take part in one round
(the earliest by ``created_idx``); the rest take part in later rounds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

MAX_SLOTS = 32
"""Pending task ids (and, separately, cancel ids) one rank contributes per round."""

ROW_LEN = 3 + 2 * MAX_SLOTS + 2
"""``[n_pending, n_cancel, shutdown, pending keys × MAX_SLOTS, cancel keys × MAX_SLOTS,
check_every proposal (0: none), hold long prefill (0/1)]``."""

_PACE = ROW_LEN - 2
_HOLD = ROW_LEN - 1

AllGather = Callable[[np.ndarray], np.ndarray]
"""``row [ROW_LEN] int64 -> rows [world_size, ROW_LEN] int64`` (rank order)."""


def task_key(task_id: str) -> int:
    """The 63-bit key a task id travels as (sha256, first 8 bytes): the same on every rank;
    never 0 (0 pads empty slots)."""
    key = int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:8], "little") >> 1
    return key or 1


@dataclass(frozen=True)
class PendingTask:
    """A generation task this rank holds but has not started: its id and the master's
    ``TaskCreated`` index."""

    task_id: str
    created_idx: int


@dataclass(frozen=True)
class LocalView:
    """What one rank brings to a round."""

    pending: Sequence[PendingTask] = ()
    cancel: Collection[str] = ()
    shutdown: bool = False
    check_every: int = 0
    """Decode steps this rank proposes until the next round (0: no proposal)."""
    hold: bool = False
    """Whether this rank asks to hold long prompts' prefill back at the next step."""


@dataclass(frozen=True)
class Agreement:
    """What every rank decided in one round (identical on every rank).

    ``start``: task ids to start now, in ``created_idx`` order (all are pending on this rank);
    ``cancel_keys``: ``task_key``s of tasks to cancel (some may be unknown to this rank yet);
    ``shutdown``: some rank was told to shut down; ``check_every``: decode steps until the
    next round, the smallest positive proposal (0: nobody proposed; keep the current pace);
    ``hold``: some rank asks to hold long prompts' prefill back at the next step.
    """

    start: tuple[str, ...] = ()
    cancel_keys: frozenset[int] = frozenset()
    shutdown: bool = False
    check_every: int = 0
    hold: bool = False


def _ordered(pending: Sequence[PendingTask]) -> list[PendingTask]:
    return sorted(pending, key=lambda p: (p.created_idx, p.task_id))


def encode_row(view: LocalView) -> np.ndarray:
    """The ``[ROW_LEN]`` int64 row this rank contributes (see ``ROW_LEN``)."""
    pending = [task_key(p.task_id) for p in _ordered(view.pending)[:MAX_SLOTS]]
    cancel = sorted(task_key(t) for t in view.cancel)[:MAX_SLOTS]
    row = np.zeros(ROW_LEN, dtype=np.int64)
    row[0], row[1], row[2] = len(pending), len(cancel), int(view.shutdown)
    row[3 : 3 + len(pending)] = pending
    row[3 + MAX_SLOTS : 3 + MAX_SLOTS + len(cancel)] = cancel
    row[_PACE] = max(0, int(view.check_every))
    row[_HOLD] = int(view.hold)
    return row


def decide(view: LocalView, rows: np.ndarray) -> Agreement:
    """The round's outcome from the gathered ``rows [world_size, ROW_LEN]``.

    Raises ``ValueError`` when ``rows`` has the wrong shape (a peer on another protocol).
    """
    rows = np.asarray(rows, dtype=np.int64)
    if rows.ndim != 2 or rows.shape[1] != ROW_LEN or rows.shape[0] < 1:
        raise ValueError(f"agreement rows must be [world_size, {ROW_LEN}], not {rows.shape}")
    everywhere: set[int] | None = None
    cancel: set[int] = set()
    for row in rows:
        n_pending, n_cancel = int(row[0]), int(row[1])
        keys = set(int(k) for k in row[3 : 3 + n_pending])
        everywhere = keys if everywhere is None else everywhere & keys
        cancel.update(int(k) for k in row[3 + MAX_SLOTS : 3 + MAX_SLOTS + n_cancel])
    assert everywhere is not None
    start = tuple(
        p.task_id
        for p in _ordered(view.pending)
        if task_key(p.task_id) in everywhere and task_key(p.task_id) not in cancel
    )
    proposals = [int(p) for p in rows[:, _PACE] if p > 0]
    return Agreement(
        start=start,
        cancel_keys=frozenset(cancel),
        shutdown=bool(rows[:, 2].any()),
        check_every=min(proposals) if proposals else 0,
        hold=bool(rows[:, _HOLD].any()),
    )


def agree(view: LocalView, all_gather: AllGather) -> Agreement:
    """One agreement round: all-gather this rank's row and decide (a collective: every rank
    calls it at the same point). A task both agreed and cancelled in the same round is
    cancelled, not started."""
    return decide(view, all_gather(encode_row(view)))


T = TypeVar("T")


@dataclass
class RoundResult(Generic[T]):
    """A round seen by one rank: ``start`` (tasks to start, in order), ``cancel`` (ids of
    tasks already started here — or started in this round — to cancel), ``dropped`` (pending
    tasks cancelled before they started: end them Cancelled without work), ``shutdown``,
    ``check_every`` (the agreed decode steps until the next round; 0: keep the current),
    ``hold`` (hold long prompts' prefill back at the next step)."""

    start: list[T] = field(default_factory=list)
    cancel: list[str] = field(default_factory=list)
    dropped: list[T] = field(default_factory=list)
    shutdown: bool = False
    check_every: int = 0
    hold: bool = False


class TaskAgreement(Generic[T]):
    """One rank's side of the agreement, between rounds.

    Guarantees: a task added here is started at most once, and only in a round where every
    rank has it; a task cancelled by agreement is never started later, even when it reaches
    this rank after the round (``add`` then returns False: end it Cancelled at once); a cancel
    wish is kept until a round has carried it. Not thread-safe: drive it from the runner's
    main thread.
    """

    def __init__(self) -> None:
        self._pending: dict[str, tuple[PendingTask, T]] = {}
        self._want_cancel: set[str] = set()
        self._want_shutdown = False
        self._cancelled_keys: set[int] = set()
        self._started: set[str] = set()

    def add(self, task_id: str, created_idx: int, task: T) -> bool:
        """Hold ``task`` until agreed. False when it is a repeat of one held or started, or
        was already cancelled by agreement (``was_cancelled``: the caller ends it Cancelled
        without work)."""
        if task_id in self._pending or task_id in self._started:
            return False
        if task_key(task_id) in self._cancelled_keys:
            return False
        self._pending[task_id] = (PendingTask(task_id, created_idx), task)
        return True

    def was_cancelled(self, task_id: str) -> bool:
        """Whether a round has already agreed to cancel ``task_id``."""
        return task_key(task_id) in self._cancelled_keys

    def want_cancel(self, task_id: str) -> None:
        """This rank was asked to cancel ``task_id`` (pending, running, or not seen yet)."""
        if task_key(task_id) not in self._cancelled_keys:
            self._want_cancel.add(task_id)

    def want_shutdown(self) -> None:
        self._want_shutdown = True

    @property
    def pending_ids(self) -> list[str]:
        return list(self._pending)

    def view(self, check_every: int = 0, hold: bool = False) -> LocalView:
        return LocalView(
            pending=[p for p, _ in self._pending.values()],
            cancel=sorted(self._want_cancel),
            shutdown=self._want_shutdown,
            check_every=check_every,
            hold=hold,
        )

    def round(self, all_gather: AllGather, check_every: int = 0, hold: bool = False) -> RoundResult[T]:
        """Run one agreement round (a collective) and update this rank's side;
        ``check_every`` is this rank's pace proposal (decode steps until the next round),
        ``hold`` whether it asks to hold long prompts' prefill back at the next step."""
        agreed = agree(self.view(check_every, hold), all_gather)
        self._cancelled_keys |= agreed.cancel_keys
        self._want_cancel = {t for t in self._want_cancel if task_key(t) not in agreed.cancel_keys}
        result: RoundResult[T] = RoundResult(shutdown=agreed.shutdown, check_every=agreed.check_every, hold=agreed.hold)
        for task_id in agreed.start:
            _, task = self._pending.pop(task_id)
            self._started.add(task_id)
            result.start.append(task)
        for task_id in list(self._pending):
            if task_key(task_id) in agreed.cancel_keys:
                result.dropped.append(self._pending.pop(task_id)[1])
        result.cancel = [t for t in self._started if task_key(t) in agreed.cancel_keys]
        return result

    def finished(self, task_id: str) -> None:
        """``task_id`` ended here: forget it (its cancel tombstone, if any, stays)."""
        self._started.discard(task_id)
