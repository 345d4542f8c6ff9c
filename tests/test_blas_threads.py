"""A pipeline rank's BLAS threads when ranks of its instance share its host
(worker/runner/blas_threads.py): the pure rules, with hypothesis."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from worker.runner.blas_threads import rank_threads, ranks_on_host, share_blas_threads


def test_ranks_on_host_counts_the_ranks_listening_on_its_ip() -> None:
    ring = ["127.0.0.1:5000", "127.0.0.1:5001", "10.0.0.2:5000"]
    assert [ranks_on_host(ring, r) for r in range(3)] == [2, 2, 1]
    assert ranks_on_host(["[::1]:1", "[::1]:2"], 0) == 2


@given(threads=st.integers(1, 256), sharing=st.integers(0, 64))
def test_a_rank_takes_its_share_of_the_threads(threads: int, sharing: int) -> None:
    n = rank_threads(threads, sharing)
    assert 1 <= n <= threads
    assert n * max(1, sharing) <= max(threads, max(1, sharing))  # never more threads than given, in all


def test_nothing_to_share_changes_nothing(monkeypatch) -> None:
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert share_blas_threads(["10.0.0.1:1", "10.0.0.2:1"], 0) is None  # each rank its own host
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    assert share_blas_threads(["127.0.0.1:1", "127.0.0.1:2"], 1) is None  # already one
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    assert share_blas_threads(["127.0.0.1:1", "127.0.0.1:2"], 1) is None  # not set: leave it
