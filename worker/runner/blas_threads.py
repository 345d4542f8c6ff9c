"""A rank's BLAS threads when other ranks of its instance share its host.

A node gives each runner as many OpenBLAS threads as it offers cores (``worker.blas``). Ranks
of one instance on one host that compute at once (tensor ranks) or that spin while they wait
for each other would then run more threads than cores: measured on 2 cores, a 2-node pipeline
whose waiting rank spun in MLX's receive ran at 0.22 of one node with 2 threads a rank and
0.94 with 1 (docs/benchmarks.md, "Pipeline at 16 requests, micro-batches"). Such a rank takes
``threads ÷ ranks on its host`` (at least 1), set at run time through OpenBLAS's
``openblas_set_num_threads`` (the library is preloaded, its symbols global). A pipeline rank
that waits asleep (``worker.engine.ring_wait``) keeps them all: the ranks take turns, and the
one whose turn it is has the host's cores (the runner decides, ``RunnerProcess.warmup``).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence


def ranks_on_host(ring_addresses: Sequence[str], rank: int) -> int:
    """How many ranks listen on the host of ``rank``'s ring address (``"ip:port"``, rank
    order; itself included)."""
    host = ring_addresses[rank].rpartition(":")[0]
    return sum(1 for a in ring_addresses if a.rpartition(":")[0] == host)


def rank_threads(threads: int, sharing: int) -> int:
    """BLAS threads of a rank whose host runs ``sharing`` ranks of its instance: ``threads``
    (the node's, per runner) ÷ ``sharing``, at least 1."""
    return max(1, threads // max(1, sharing))


def share_blas_threads(ring_addresses: Sequence[str], rank: int) -> int | None:
    """Lower this process's OpenBLAS threads to its share (``rank_threads``) when other ranks
    share its host; returns the threads set, or None (nothing to do, or no OpenBLAS loaded)."""
    given = os.environ.get("OPENBLAS_NUM_THREADS", "")
    if not given.isdigit() or not ring_addresses or not 0 <= rank < len(ring_addresses):
        return None
    threads = rank_threads(int(given), ranks_on_host(ring_addresses, rank))
    if threads == int(given):
        return None
    setter = getattr(ctypes.CDLL(None), "openblas_set_num_threads", None)
    if setter is None:
        return None
    setter(ctypes.c_int(threads))
    os.environ["OPENBLAS_NUM_THREADS"] = str(threads)
    return threads
