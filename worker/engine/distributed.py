"""The MLX ring group of a multi-rank instance: bounded init, size check, small collectives.

MLX's ring backend (``mx.distributed.init(strict=True, backend="ring")``) reads two
environment variables when it initialises: ``MLX_RANK`` (this rank) and ``MLX_HOSTFILE``, a
JSON file listing, per rank, the ``"ip:port"`` addresses that rank listens on
(``[["10.0.0.1:5000"], ["10.0.0.2:5001"], ...]``, as ``mlx.launch`` writes it). We write that
file from the instance's shards (``ShardMetadata.ring_address``, in rank order): the host list
comes from the placement, one master-side decision, so every rank uses the same one.

Connection order (measured on mlx 0.32, loopback): rank 0 only *accepts* and waits as long as
it takes; ranks ≥ 1 *connect* to their neighbours and retry for about 30 s, then fail with
"[ring] Couldn't connect". So rank 0 (and, generally, the listening side) must be up first and
every other rank must start connecting within ~30 s of it — the ranks that connect last are
the ranks ≥ 1. The worker's plan sends ``ConnectToGroup`` to every rank at once, which keeps
them well within that window. ``init_ring`` bounds the wait (``CONNECT_TIMEOUT``, enforced by a watchdog
process because MLX holds the GIL while it waits) so a rank whose peers never come reports
Failed and exits instead of hanging.

The group's size must equal the instance's world_size: a ring that silently comes
up as a group of one is an error, never a fallback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import mlx.core as mx
import numpy as np

from worker.engine.ring_wait import NO_WAIT, RingWait

CONNECT_TIMEOUT = 45.0
"""Seconds ``init_ring`` waits for its ring neighbours (below the supervisor's 60 s bound for
a silent connecting runner, so our error is the one reported)."""


UNSPECIFIED_HOSTS = frozenset({"0.0.0.0", "::", "[::]", ""})


def hostfile_entries(ring_addresses: Sequence[str]) -> list[list[str]]:
    """The ring hostfile content for ``ring_addresses`` (one ``"ip:port"`` per rank, rank
    order). MLX's ring binds each rank's listener to its own entry, so the ring listens only
    at the address placement chose (its traffic is plain TCP: docs/cluster.md "Security"). Raises
    ``ValueError`` for an empty or malformed address, or an unspecified one (``0.0.0.0``,
    ``::``), which would listen on every interface."""
    entries = []
    for rank, address in enumerate(ring_addresses):
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"rank {rank} has no ring address 'ip:port' (got {address!r})")
        if host in UNSPECIFIED_HOSTS:
            raise ValueError(f"rank {rank} has the unspecified ring address {address!r}: the ring must listen at one interface's address")
        entries.append([address])
    return entries


def check_group_size(group: mx.distributed.Group, world_size: int) -> None:
    """Raise ``RuntimeError("expected world size N, got M")`` when the group is not the
    instance's size."""
    if group.size() != world_size:
        raise RuntimeError(f"expected world size {world_size}, got {group.size()}")


_WATCHDOG = """
import os, signal, sys, time
ppid, deadline, fd, payload = int(sys.argv[1]), time.monotonic() + float(sys.argv[2]), int(sys.argv[3]), bytes.fromhex(sys.argv[4])
while time.monotonic() < deadline:
    time.sleep(0.2)
    if os.getppid() != ppid:
        os._exit(0)
try:
    os.write(fd, payload)
finally:
    os.kill(ppid, signal.SIGKILL)
"""


def _stderr_report(message: str) -> tuple[int, bytes]:
    return 2, (message + "\n").encode()


def init_ring(
    ring_addresses: Sequence[str] | None,
    rank: int,
    world_size: int,
    *,
    timeout: float = CONNECT_TIMEOUT,
    timeout_report: Callable[[str], tuple[int, bytes]] = _stderr_report,
) -> mx.distributed.Group:
    """Join the ring of ``world_size`` ranks as ``rank`` and return the group.

    ``ring_addresses``: every rank's listen address, rank order (None: no hostfile, which
    must fail — used by the ``ring=no_hostfile`` fault hook, ``worker.runner.faults``).

    MLX's init holds the GIL while it waits for the neighbours (no Python thread, signal
    handler or heartbeat runs meanwhile), so the bound is a watchdog *process*: when the init
    has not returned after ``timeout`` seconds it writes ``timeout_report(message)`` = ``(fd,
    bytes)`` (default: the message on stderr; the runner passes its status pipe and a framed
    ``RunnerFailed``) and kills this process with SIGKILL. The message names the rank and the
    addresses waited for.

    Raises ``RuntimeError("expected world size N, got M")`` when the group has another size;
    ``RuntimeError`` from MLX when a neighbour refuses the connection for ~30 s;
    ``ValueError`` for bad addresses or ranks.
    """
    if world_size < 2:
        raise ValueError("init_ring is for instances of 2 or more ranks")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not within a world of {world_size}")
    os.environ["MLX_RANK"] = str(rank)
    hostfile: Path | None = None
    if ring_addresses is not None:
        if len(ring_addresses) != world_size:
            raise RuntimeError(f"expected world size {world_size}, got {len(ring_addresses)} ring addresses")
        fd, name = tempfile.mkstemp(prefix="exo-p2p-ring-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(hostfile_entries(ring_addresses), f)
        hostfile = Path(name)
        os.environ["MLX_HOSTFILE"] = str(hostfile)
    else:
        os.environ.pop("MLX_HOSTFILE", None)

    message = (
        f"ring init of rank {rank}/{world_size} timed out after {timeout:.0f} s waiting for "
        f"its neighbours ({', '.join(ring_addresses or ())})"
    )
    report_fd, payload = timeout_report(message)
    watchdog = subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(timeout), str(report_fd), payload.hex()],
        pass_fds=(report_fd,) if report_fd > 2 else (),
        stdin=subprocess.DEVNULL,
    )
    try:
        group = mx.distributed.init(strict=ring_addresses is not None, backend="ring")
    finally:
        watchdog.kill()
        watchdog.wait()
        if hostfile is not None:
            hostfile.unlink(missing_ok=True)
    check_group_size(group, world_size)
    return group


def ring_all_gather(group: mx.distributed.Group, stream: mx.Stream | None = None,
                    wait: RingWait = NO_WAIT) -> Callable[[np.ndarray], np.ndarray]:
    """An all-gather of one int64 row per rank over ``group``: ``row [W] -> [world, W]``.

    Run on ``stream`` (the generation stream) so it is ordered with the pipeline's own
    collectives: two streams could interleave collectives differently on different ranks.
    A rank < W − 1 first lets the work it posted finish, then waits asleep for rank + 1's
    part (``wait``, see ``ring_wait``).
    """
    last = group.rank() == group.size() - 1

    def all_gather(row: np.ndarray) -> np.ndarray:
        on = stream if stream is not None else mx.default_stream(mx.default_device())
        if wait.active and not last:  # read each time: the engine may disable it (micro-batches)
            mx.synchronize(on)
            wait.from_either()
        with mx.stream(on):
            out = mx.distributed.all_gather(mx.array(row, dtype=mx.int64)[None], group=group)
            mx.eval(out)
        return np.array(out, dtype=np.int64).reshape(group.size(), -1)

    return all_gather
