"""Rank child processes for the pipeline and tensor tests (tests/test_pipeline.py,
tests/test_tensor.py): start one ``python -m <module> '<json config>'`` per rank, wait for all
of them within one bound, and on a timeout say where each rank was.

Each rank writes stdout and stderr to files, never to pipes: a test that drains one rank's
pipes at a time leaves the others' unread, and a rank blocked writing a full pipe (64 KiB)
stalls every collective of its ring — the whole group hangs. On a timeout every live rank
gets ``SIGUSR1``, which ``child_main`` has bound to ``faulthandler`` (every thread's Python
stack to stderr), so the failure shows each rank's stack (e.g. waiting in ``mx.eval`` of a
ring collective) and the tail of its progress lines.

A rank ends with ``ring_barrier`` before it returns its result. The engine queues the
next decode step before it reads the current token (``worker.engine.batch``), so when a
request ends with end-of-turn every rank still has that discarded step's collectives in
flight. A rank that exited then closed its ring sockets under its neighbours' collective
("[ring] Socket N was closed by the peer", "Failing pending tasks"). MLX's thread for that
socket fails what it holds and stops for good (mlx 0.32 ``mlx/distributed/ring/ring.cpp``,
``SocketThread::worker``), so the step's next all-reduce queued to it never completes, nor
anything queued behind it on the stream: rank 0 of the tensor test hung in ``np.save`` of
its logits after its last prompt (reproduced on 2 loaded cores: ranks 1 and 2 done at
+124 s, rank 0 still there 770 s later). The barrier is one more collective on the
generation stream, after that step on every rank, so no rank exits while a neighbour
still needs it.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import rank_env

ROOT = Path(__file__).resolve().parents[2]
STACK_WAIT = 2.0
"""Seconds a timed-out rank is given to write its stacks before it is killed."""


def run_rank_processes(module: str, cfgs: list[dict[str, Any]], timeout: float,
                       workdir: Path | None = None) -> list[dict[str, Any]]:
    """Run ``python -m module json(cfg)`` for each of ``cfgs`` (rank order) and return each
    rank's result: the JSON object on the last line of its stdout.

    ``timeout``: seconds for all ranks together. Raises ``AssertionError`` naming every rank
    that failed (its stderr tail) or did not finish in time (its stack dump and stderr tail).
    Every process is killed and reaped before this returns or raises."""
    workdir = Path(tempfile.mkdtemp(prefix="ranks-", dir=workdir))
    outs = [workdir / f"rank-{rank}.out" for rank in range(len(cfgs))]
    errs = [workdir / f"rank-{rank}.err" for rank in range(len(cfgs))]
    procs: list[subprocess.Popen] = []
    try:
        for rank, cfg in enumerate(cfgs):
            with open(outs[rank], "w") as out, open(errs[rank], "w") as err:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", module, json.dumps(cfg)], cwd=ROOT, stdout=out,
                    stderr=err, env=rank_env({"HF_HUB_OFFLINE": "1"})))
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        late = [rank for rank, p in enumerate(procs) if p.poll() is None]
        for rank in late:
            procs[rank].send_signal(signal.SIGUSR1)
        if late:
            time.sleep(STACK_WAIT)
        problems, results = [], []
        for rank, p in enumerate(procs):
            tail = errs[rank].read_text(errors="replace")[-4000:]
            if rank in late:
                problems.append(f"rank {rank} did not finish within {timeout} s; its stderr (stacks last):\n{tail}")
            elif p.returncode != 0:
                problems.append(f"rank {rank} failed (rc {p.returncode}): {tail}")
            else:
                results.append(json.loads(outs[rank].read_text().strip().splitlines()[-1]))
        if problems:
            raise AssertionError("\n".join(problems))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)


def ring_wait_for(addresses: list[str] | None, rank: int) -> Any:
    """The ``RingWait`` a runner's pipeline rank uses (``worker.engine.ring_wait.ring_wait``)
    for this rank process's ring; ``NO_WAIT`` without ``addresses``. On 2 or more ranks both
    sockets must be found (``AssertionError``)."""
    from worker.engine.ring_wait import NO_WAIT, ring_wait

    if addresses is None:
        return NO_WAIT
    wait = ring_wait(addresses, rank)
    assert wait.active or len(addresses) < 2, f"rank {rank}: ring sockets not found"
    return wait


def ring_barrier(group: Any) -> None:
    """Return once every rank of ``group`` has finished every collective it queued on the
    generation stream (``worker.engine.forward.generation_stream``): an ``all_sum`` of one
    element there, evaluated. Call it on every rank before returning (see the module doc)."""
    import mlx.core as mx

    from worker.engine.forward import generation_stream

    with mx.stream(generation_stream):
        done = mx.distributed.all_sum(mx.zeros((1,), dtype=mx.int32), group=group)
    mx.eval(done)


def child_main(rank_main: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """The ``__main__`` of a rank module: run ``rank_main(json config from argv[1])``, print
    its result as one JSON line and exit at once (``os._exit``: a ring thread may still be
    blocked in MLX). ``SIGUSR1`` dumps every thread's stack to stderr (see the module doc)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        print(json.dumps(rank_main(json.loads(sys.argv[1]))), flush=True)
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)
