"""Waiting for a ring neighbour asleep in the kernel, not in a spinning thread.

MLX's ring backend gives each of a rank's sockets a thread that, while a send or receive is
posted, calls the non-blocking ``recv``/``send`` in a loop until it completes (mlx 0.32,
``SocketThread::worker``): a rank that has posted a receive spins a whole core until its
neighbour's bytes come. A pipeline rank waits most of the time — rank 1 for rank 0's hidden
states, rank 0 for the tokens rank 1 samples — so each rank spun while the other computed:
on a host whose cores the ranks share, a core taken from the rank computing, and half the
pipeline's CPU time (docs/benchmarks.md, "Pipeline at 16 requests").

So before posting a collective whose bytes come from a neighbour still computing, a rank
waits in ``poll(2)`` until the first of those bytes are in its socket's receive buffer;
MLX's receive, posted then, finds them there. The ring's sockets (mlx 0.32): ``left`` is the
connection this rank accepted from rank − 1, ``right`` the one it made to rank + 1; a send to
rank + 1 goes out on ``right``, a receive from rank − 1 reads ``left``; the small all-sums
and all-gathers read one of the two, which one depending on the array's size. So:

- a rank > 0 waits on ``left`` before the receive of its input hidden states
  (``from_left``);
- a rank < W − 1 waits on either socket before the all-sum of the sampled tokens and before
  an all-gather (``from_either``), once the work it posted before has finished (bytes of an
  earlier collective still unread would end the wait at once).

The last rank never waits before a collective: it sends its part at once, which wakes rank
W − 2, whose part wakes W − 3, …, so the waits cannot deadlock. Waiting never reads a socket:
it only delays when a collective is posted, never what it carries or the order of the
collectives, and it is bounded (``PATIENCE``): past it the collective is posted anyway and
spins as without the wait.

A wait is woken only by bytes, so every rank's part of a collective must put bytes on the
wire: MLX's ring all-sum (mlx 0.32, ``RingGroup::all_reduce``) cuts an array of n ≥ W
elements into W segments of ``ceil(n / W)`` elements, the last ones shorter or empty (n 4 on
3 ranks: 2, 2 and 0), and a rank whose first segment is empty sends nothing and waits to
receive, while the neighbour it should have woken sleeps on: 3-rank rings stalled until each
wait's patience ran out. So the pipeline pads the all-sum of its tokens with zeros to
``all_sum_length`` elements, a multiple of the ranks: every segment holds bytes.

Only without micro-batches: their ranks compute at once, each on a host of its own (micro
batches are on by default only there, ``micro.auto_micro_batches``), where a spinning receive
takes no core from a neighbour; an engine with micro-batches disables the wait
(``builder.build_engine``) and those ranks wait in MLX's receive as before. (With the padding,
tests/test_micro.py's 2- and 3-rank micro-batch runs also pass with the wait on; its gain
there is not measured.)
"""

from __future__ import annotations

import select
import sys
from collections.abc import Sequence
from typing import Any

PATIENCE = 30.0
"""Seconds one wait lasts at most; then the collective is posted as if no wait existed (its
receive spins until the bytes come, as MLX does alone)."""


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def ring_sockets(addresses: Sequence[str], rank: int) -> tuple[int | None, int | None]:
    """The file descriptors ``(left, right)`` of this process's ring connections, found among
    its TCP connections by address: ``right`` is connected to rank + 1's ring address,
    ``left`` was accepted at this rank's own. None for a socket not found (exactly one must
    match). Call after the ring is up; ``addresses``: every rank's ``"ip:port"``, rank order."""
    import psutil

    me, right_address = _split(addresses[rank]), _split(addresses[(rank + 1) % len(addresses)])
    process = psutil.Process()
    connections = getattr(process, "net_connections", None) or process.connections
    lefts, rights = [], []
    for c in connections(kind="tcp"):
        if c.fd < 0 or c.status != psutil.CONN_ESTABLISHED or not c.raddr:
            continue
        if (c.raddr.ip, c.raddr.port) == right_address:
            rights.append(c.fd)
        elif (c.laddr.ip, c.laddr.port) == me:
            lefts.append(c.fd)
    return (lefts[0] if len(lefts) == 1 else None), (rights[0] if len(rights) == 1 else None)


class RingWait:
    """Waits until bytes from a ring neighbour are readable (see the module docstring).
    ``left``/``right``: the ring sockets' descriptors (None: no wait on that side)."""

    def __init__(self, left: int | None, right: int | None, patience: float = PATIENCE) -> None:
        self.left, self.right, self.patience = left, right, patience
        self.timeouts = 0  # waits that ran out of patience (the collective was posted anyway)

    @property
    def active(self) -> bool:
        """Whether it waits at all (both sockets known)."""
        return self.left is not None and self.right is not None

    def disable(self) -> None:
        """Never wait from now on (every user of this object at once: the stage and the
        all-gather). The engine disables it for micro-batches (``builder.build_engine``)."""
        self.left = self.right = None

    def from_left(self) -> None:
        """Return once bytes from rank − 1 are readable (or at once: no left socket)."""
        self._wait(self.left)

    def from_either(self) -> None:
        """Return once bytes from either neighbour are readable (or at once: a socket not
        found). Either: MLX picks a collective's direction by its size (an all-sum of fewer
        elements than ranks runs the other way round)."""
        self._wait(self.left, self.right)

    def _wait(self, *fds: int | None) -> None:
        if not self.active:
            return
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN | select.POLLPRI)
        if not poller.poll(int(self.patience * 1000)):
            self.timeouts += 1


NO_WAIT = RingWait(None, None)
"""Never waits (a single rank, a tensor instance, a ring whose sockets were not found)."""


def all_sum_length(rows: int, world: int) -> int:
    """The length a pipeline pads its ``rows`` sampled tokens to before the all-sum over
    ``world`` ranks: the least multiple of ``world`` not below ``rows`` (at least ``world``),
    so each of the ring's segments carries at least one element and wakes the neighbour
    asleep on it (see the module docstring). Raises ``ValueError`` for ``rows`` < 1 or
    ``world`` < 1."""
    if rows < 1 or world < 1:
        raise ValueError(f"rows {rows} and world {world} must be at least 1")
    return -(-rows // world) * world


def ring_wait(addresses: Sequence[str], rank: int) -> RingWait:
    """The ``RingWait`` of rank ``rank`` of a pipeline ring (``addresses``: every rank's
    ``"ip:port"``, rank order): NO_WAIT for a single rank, or when a socket is not found (said
    on stderr: the ranks then spin as MLX does alone)."""
    if len(addresses) < 2:
        return NO_WAIT
    left, right = ring_sockets(addresses, rank)
    if left is None or right is None:
        print(f"runner: ring sockets of rank {rank} not found (left {left}, right {right}): "
              "waiting ranks spin", file=sys.stderr, flush=True)
        return NO_WAIT
    return RingWait(left, right)


def pipeline_wait(instance: Any, rank: int) -> RingWait:
    """The ``RingWait`` of rank ``rank`` of ``instance`` (an ``exo_p2p.types.Instance``; call
    once its ring is up): ``ring_wait`` of its ring for a pipeline, NO_WAIT for a tensor
    instance (its ranks compute at once, its all-reduces wait for no one's turn)."""
    if instance.sharding != "pipeline":
        return NO_WAIT
    return ring_wait([s.ring_address for s in instance.shards], rank)
