"""Task agreement (worker/engine/agreement.py) with simulated ranks, no MLX.

Each simulated rank is a thread; the injected all-gather is a barrier exchange, as the ring's
is. Hypothesis draws when (which round) each task reaches each rank — or never — and when
cancels reach some ranks; every rank must start the same tasks in the same order, each once,
in created_idx order within a round, and only tasks every rank has; every cancel is agreed in
the same round on every rank.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.engine.agreement import (
    MAX_SLOTS,
    ROW_LEN,
    LocalView,
    PendingTask,
    TaskAgreement,
    agree,
    decide,
    encode_row,
    task_key,
)

ROUND_TIMEOUT = 10.0


class SimulatedRing:
    """An all-gather among ``world`` threads: each contributes a row, all get every row."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.rows: list[np.ndarray | None] = [None] * world
        self.barrier = threading.Barrier(world, timeout=ROUND_TIMEOUT)

    def all_gather_for(self, rank: int):
        def all_gather(row: np.ndarray) -> np.ndarray:
            self.rows[rank] = row
            self.barrier.wait()
            out = np.stack([r for r in self.rows if r is not None])
            self.barrier.wait()  # nobody overwrites a row before everyone has read them
            return out

        return all_gather


def run_ranks(world: int, n_rounds: int, arrivals: dict[tuple[int, int], int], cancels: dict[tuple[int, int], int]):
    """Simulate ``n_rounds`` rounds. ``arrivals[(rank, task)] = round`` the task reaches that
    rank (absent: never); ``cancels[(rank, task)] = round`` a cancel reaches it. Returns per
    rank a list of rounds, each ``(started task ids, cancelled keys, dropped ids)``."""
    ring = SimulatedRing(world)
    logs: list[list[tuple[list[str], list[str], list[str]]]] = [[] for _ in range(world)]
    errors: list[BaseException] = []

    def rank_loop(rank: int) -> None:
        side: TaskAgreement[str] = TaskAgreement()
        gather = ring.all_gather_for(rank)
        try:
            for rnd in range(n_rounds):
                for (r, task), at in sorted(arrivals.items()):
                    if r == rank and at == rnd:
                        side.add(f"t{task}", task, f"t{task}")
                for (r, task), at in sorted(cancels.items()):
                    if r == rank and at == rnd:
                        side.want_cancel(f"t{task}")
                res = side.round(gather)
                logs[rank].append((list(res.start), sorted(res.cancel), sorted(res.dropped)))
        except BaseException as e:  # noqa: BLE001 - reported to the test thread
            errors.append(e)
            ring.barrier.abort()

    threads = [threading.Thread(target=rank_loop, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(ROUND_TIMEOUT * (n_rounds + 1))
        assert not t.is_alive(), "a simulated rank hung"
    if errors:
        raise errors[0]
    return logs


@st.composite
def schedules(draw):
    world = draw(st.integers(2, 3))
    n_tasks = draw(st.integers(1, 6))
    n_rounds = 8
    arrivals = {}
    for task in range(n_tasks):
        for rank in range(world):
            at = draw(st.one_of(st.none(), st.integers(0, n_rounds - 2)))
            if at is not None:
                arrivals[(rank, task)] = at
    cancels = {}
    for task in draw(st.sets(st.integers(0, n_tasks - 1), max_size=2)):
        cancels[(draw(st.integers(0, world - 1)), task)] = draw(st.integers(0, n_rounds - 2))
    return world, n_tasks, n_rounds, arrivals, cancels


@settings(max_examples=150, deadline=None)
@given(schedules())
def test_ranks_start_the_same_tasks_in_the_same_order(schedule) -> None:
    world, n_tasks, n_rounds, arrivals, cancels = schedule
    logs = run_ranks(world, n_rounds, arrivals, cancels)
    first_cancel = {}
    for (_, task), at in cancels.items():
        first_cancel[task] = min(at, first_cancel.get(task, n_rounds))
    # the same decisions on every rank, round by round (started order and agreed cancels)
    for rank in range(1, world):
        assert [entry[0] for entry in logs[rank]] == [entry[0] for entry in logs[0]]
    started = [t for entry in logs[0] for t in entry[0]]
    assert len(started) == len(set(started))  # each task at most once
    for rnd, (start, _, _) in enumerate(logs[0]):
        idx = [int(t[1:]) for t in start]
        assert idx == sorted(idx)  # created_idx order within a round
        for task in idx:
            # only when every rank has it, and never after its cancel was agreed
            assert all(arrivals.get((r, task), n_rounds) <= rnd for r in range(world))
            assert first_cancel.get(task, n_rounds) > rnd
    for task in range(n_tasks):
        everywhere = max(arrivals.get((r, task), n_rounds) for r in range(world))
        cancelled_before = first_cancel.get(task, n_rounds) <= everywhere
        if everywhere < n_rounds and not cancelled_before:
            # started in the round where the last rank got it (unless cancelled that round)
            if first_cancel.get(task, n_rounds) != everywhere:
                assert f"t{task}" in logs[0][everywhere][0]
        if cancelled_before:
            assert f"t{task}" not in started
    # a started task that is later cancelled is cancelled on every rank in the same round
    for rank in range(world):
        assert [entry[1] for entry in logs[rank]] == [entry[1] for entry in logs[0]]


def test_decide_uses_created_order_not_arrival_or_id_order() -> None:
    view = LocalView(pending=[PendingTask("zzz", 3), PendingTask("aaa", 7), PendingTask("mmm", 1)])
    other = LocalView(pending=[PendingTask("aaa", 7), PendingTask("zzz", 3)])  # lacks "mmm"
    rows = np.stack([encode_row(view), encode_row(other)])
    assert decide(view, rows).start == ("zzz", "aaa")
    assert decide(other, rows).start == ("zzz", "aaa")


def test_any_rank_cancel_is_agreed_and_shutdown_too() -> None:
    a = LocalView(pending=[PendingTask("t1", 1)], cancel=["t9"])
    b = LocalView(pending=[PendingTask("t1", 1)], cancel=["t1"], shutdown=True)
    rows = np.stack([encode_row(a), encode_row(b)])
    out = agree(a, lambda row: rows)
    assert out.start == ()  # agreed and cancelled in the same round: cancelled
    assert out.cancel_keys == {task_key("t1"), task_key("t9")} and out.shutdown


def test_rows_are_fixed_size_and_overflow_waits_for_a_later_round() -> None:
    many = [PendingTask(f"t{i}", i) for i in range(MAX_SLOTS + 5)]
    row = encode_row(LocalView(pending=many))
    assert row.shape == (ROW_LEN,) and row.dtype == np.int64 and row[0] == MAX_SLOTS
    out = decide(LocalView(pending=many), np.stack([row, row]))
    assert out.start == tuple(f"t{i}" for i in range(MAX_SLOTS))  # the earliest first
    with pytest.raises(ValueError):
        decide(LocalView(), np.zeros((2, ROW_LEN + 1), dtype=np.int64))


def test_late_arrival_of_an_agreed_cancelled_task_is_refused() -> None:
    side: TaskAgreement[str] = TaskAgreement()
    peer_row = encode_row(LocalView(cancel=["t5"]))
    side.round(lambda row: np.stack([row, peer_row]))
    assert side.was_cancelled("t5")
    assert side.add("t5", 5, "t5") is False
    assert side.add("t6", 6, "t6") is True and side.add("t6", 6, "t6") is False
