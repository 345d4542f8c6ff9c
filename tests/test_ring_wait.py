"""A pipeline rank waiting for its neighbour sleeps (worker/engine/ring_wait.py).

Unit: ``ring_sockets`` finds the two ring connections among a process's TCP connections, laid
out as MLX's ring lays them out (rank 0 accepts at its own address, then connects to rank
1's); ``RingWait`` returns once bytes are readable on the socket it waits on, after its
patience when none come, and at once when it has no sockets. ``all_sum_length`` pads a
pipeline's tokens so no segment of MLX's ring all-sum is empty (a rank with an empty first
segment sends nothing and the neighbour asleep on it never wakes).

Across two rank processes on a real MLX ring (127.0.0.1): while one rank sleeps 1.5 s before
its part of a collective, the other, waiting for it through ``RingWait``, uses under 0.4 s of
CPU (the bound's slack: imports and the collective itself take a few tens of ms). Without the
wait MLX's receive spins a core the whole time; that figure is printed beside ours, not
asserted (it is MLX's behaviour, not ours).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.support.cluster import free_ports  # noqa: E402
from tests.support.ranks import child_main, ring_barrier, ring_wait_for, run_rank_processes  # noqa: E402
from worker.engine.ring_wait import NO_WAIT, RingWait, all_sum_length, ring_sockets  # noqa: E402

DELAY = 1.5
"""Seconds the rank whose turn it is sleeps before its part."""
CPU_BOUND = 0.4
"""CPU seconds the waiting rank may use meanwhile (0 if it slept the whole time)."""


def _listener(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(1)
    return s


@pytest.mark.integration
def test_ring_sockets_finds_left_and_right_of_each_rank() -> None:
    """Both ranks of a 2-rank ring in one process: each rank's left (accepted at its own
    address) and right (connected to the next rank's) are told apart from the other's."""
    ports = free_ports(2)
    addresses = [f"127.0.0.1:{p}" for p in ports]
    listeners = [_listener(p) for p in ports]
    opened: list[socket.socket] = list(listeners)
    try:
        right0 = socket.create_connection(("127.0.0.1", ports[1]))  # rank 0 -> rank 1
        left1, _ = listeners[1].accept()
        right1 = socket.create_connection(("127.0.0.1", ports[0]))  # rank 1 -> rank 0
        left0, _ = listeners[0].accept()
        opened += [right0, left1, right1, left0]
        assert ring_sockets(addresses, 0) == (left0.fileno(), right0.fileno())
        assert ring_sockets(addresses, 1) == (left1.fileno(), right1.fileno())
        assert ring_sockets([f"127.0.0.1:{free_ports(1)[0]}", addresses[1]], 0)[0] is None  # no such left
    finally:
        for s in opened:
            s.close()


def _write_later(sock: socket.socket, delay: float) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(delay), sock.send(b"x")), daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("side", ["left", "right"])
def test_wait_returns_when_bytes_come_and_sleeps_meanwhile(side: str) -> None:
    left_a, left_b = socket.socketpair()
    right_a, right_b = socket.socketpair()
    try:
        wait = RingWait(left_a.fileno(), right_a.fileno(), patience=10.0)
        writer = _write_later(left_b if side == "left" else right_b, 0.5)
        t0, cpu0 = time.monotonic(), time.process_time()
        wait.from_either()
        waited, cpu = time.monotonic() - t0, time.process_time() - cpu0
        writer.join()
        assert 0.4 < waited < 5.0 and cpu < 0.2 and wait.timeouts == 0
        if side == "left":  # from_left sees them too; bytes unread end a wait at once
            t0 = time.monotonic()
            wait.from_left()
            assert time.monotonic() - t0 < 0.5
    finally:
        for s in (left_a, left_b, right_a, right_b):
            s.close()


def test_wait_ends_after_its_patience_and_counts_it() -> None:
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    try:
        wait = RingWait(a.fileno(), c.fileno(), patience=0.3)
        t0 = time.monotonic()
        wait.from_left()
        wait.from_either()
        assert 0.5 < time.monotonic() - t0 < 5.0 and wait.timeouts == 2
    finally:
        for s in (a, b, c, d):
            s.close()


def ring_segments(n: int, world: int) -> list[int]:
    """Elements in each segment of MLX's ring all-sum of ``n`` ≥ ``world`` elements (mlx 0.32,
    ``RingGroup::all_reduce_impl``: segments of ``ceil(n / world)``, the last ones what is left)."""
    step = -(-n // world)
    return [max(0, min(n, (i + 1) * step) - i * step) for i in range(world)]


def test_unpadded_tokens_leave_a_segment_empty() -> None:
    """What stalled 3-rank pipelines: 4 rows on 3 ranks (and 5, 6 or 9 rows on 4)."""
    assert ring_segments(4, 3) == [2, 2, 0]
    assert [n for n in range(4, 13) if 0 in ring_segments(n, 4)] == [5, 6, 9]


@given(rows=st.integers(1, 512), world=st.integers(2, 16))
def test_padded_tokens_fill_every_segment(rows: int, world: int) -> None:
    n = all_sum_length(rows, world)
    assert n % world == 0 and rows <= n < rows + world
    assert min(ring_segments(n, world)) >= 1


def test_all_sum_length_refuses_nonsense() -> None:
    for rows, world in ((0, 2), (3, 0), (-1, 3)):
        with pytest.raises(ValueError):
            all_sum_length(rows, world)


def test_no_wait_returns_at_once() -> None:
    t0 = time.monotonic()
    NO_WAIT.from_left()
    NO_WAIT.from_either()
    assert not NO_WAIT.active and time.monotonic() - t0 < 0.05
    assert not RingWait(3, None).active


# --- across rank processes ------------------------------------------------------------------

def rank_main(cfg: dict[str, Any]) -> dict[str, Any]:
    """One rank of 2: the hidden-states hop (rank 1 receives what rank 0 sends after
    ``DELAY``), then the tokens' all-sum (rank 0 waits for rank 1, which adds its part after
    ``DELAY``). Returns the CPU seconds this process used while it waited in each."""
    import mlx.core as mx

    from worker.engine.distributed import init_ring
    from worker.engine.forward import generation_stream

    rank = cfg["rank"]
    group = init_ring(cfg["addresses"], rank, 2, timeout=30.0)
    wait = ring_wait_for(cfg["addresses"], rank) if cfg["wait"] else NO_WAIT
    cpu: dict[str, float] = {}
    with mx.stream(generation_stream):
        if rank == 0:
            time.sleep(DELAY)
            mx.eval(mx.distributed.send(mx.ones((16, 576)), 1, group=group))
        else:
            cpu0 = time.process_time()
            wait.from_left()
            got = mx.distributed.recv_like(mx.zeros((16, 576)), 0, group=group)
            mx.eval(got)
            cpu["hop"] = time.process_time() - cpu0
            assert float(got.sum()) == 16 * 576
        if rank == 1:
            time.sleep(DELAY)
        cpu0 = time.process_time()
        if rank == 0:
            wait.from_either()
        total = mx.distributed.all_sum(mx.full((16,), rank + 1, dtype=mx.int32), group=group)
        mx.eval(total)
        if rank == 0:
            cpu["all_sum"] = time.process_time() - cpu0
        assert total.tolist() == [3] * 16
    ring_barrier(group)
    return {"rank": rank, "cpu": cpu}


def _run(wait: bool) -> dict[str, float]:
    addresses = [f"127.0.0.1:{p}" for p in free_ports(2)]
    results = run_rank_processes("tests.test_ring_wait", [{"rank": r, "addresses": addresses, "wait": wait}
                                                          for r in range(2)], timeout=120)
    return {**results[1]["cpu"], **results[0]["cpu"]}


@pytest.mark.integration
def test_a_waiting_rank_sleeps_while_the_other_computes() -> None:
    ours, spinning = _run(wait=True), _run(wait=False)
    print(f"CPU s while waiting {DELAY} s: with RingWait {ours}, in MLX's receive alone {spinning}")
    assert ours["hop"] < CPU_BOUND, ours
    assert ours["all_sum"] < CPU_BOUND, ours


if __name__ == "__main__":
    child_main(rank_main)
