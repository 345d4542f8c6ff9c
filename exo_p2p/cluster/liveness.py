"""Who is alive, by this node's monotonic clock only (docs/architecture.md#defaults; tests/test_election.py).

Each heartbeat received is stamped with the receiver's ``now`` (a monotonic clock injected
by the caller); a peer is alive while its last heartbeat is younger than ``timeout``
seconds. Wall clocks are never compared, so a peer whose clock is off by hours, or a slow
profile probe that does not stop heartbeats, never looks dead.

**Late because this host is busy is not gone** (``silence``). While this node's own loop
is stalled (a long task step, or the process waiting for a core on a loaded host: measured
by ``exo_p2p.node.loop_watch``), the heartbeats that arrive wait unread and are stamped only when
the loop runs again — and the check that times a peer out may run before the read. So the
time this node's loop was stalled since a peer was last heard does not count as that peer's
silence, up to ``timeout`` (a dead peer is still gone within ``2 × timeout`` however busy
this host is). A node whose loop lagged 3.5 s once declared its live master gone and split
the cluster.

**A node listens before it judges** (``gone_silent``): a peer is gone only when, besides its
silence above, this node's loop has also *run* for ``LISTEN_AFTER_STALL`` s since the peer was
last heard (wall time minus this node's stalls, uncapped). A node stopped (SIGSTOP) or starved
for longer than one timeout would otherwise judge its live master gone the moment it woke,
before reading the heartbeats waiting in its sockets — and claim a term of its own (a
follower SIGSTOPped 10 s under load did). A dead peer is still gone once this node has run
that long; on a host whose loop keeps running, within ``2 × timeout``.

**Late because the peer's host is busy is not gone either** (``peer_lag``). Each heartbeat
carries the longest stall of its sender's own loop in the last ``LAG_REPORT_WINDOW`` s
(``Heartbeat.lag_ms``): a peer whose loop has been stalling for up to L s (its host starved of
CPU) is given L s more before it counts as gone. The two graces together are capped at one
``timeout``, so a dead peer is still gone within ``2 × timeout`` whatever either side says; a
peer can only delay its own timeout this way (its heartbeat is its own: ``heartbeats``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from exo_p2p import defaults
from exo_p2p.cluster.messages import Heartbeat

Stalled = Callable[[float, float], float]
"""``stalled(t0, t1)``: seconds this node's loop was stalled between ``t0`` and ``t1``."""


def no_stall(_t0: float, _t1: float) -> float:
    return 0.0


def stalled_between(stalls: Sequence[tuple[float, float]], t0: float, t1: float) -> float:
    """Seconds of the ``(start, end)`` intervals ``stalls`` within ``[t0, t1]``."""
    return sum(max(0.0, min(end, t1) - max(start, t0)) for start, end in stalls)


def silence(heard_at: float, now: float, timeout: float, stalled: Stalled = no_stall, peer_lag: float = 0.0) -> float:
    """Seconds a peer last heard at ``heard_at`` has been silent at ``now``: this node's own
    stalls since then and the peer's reported loop lag ``peer_lag`` (seconds) not counted, up
    to ``timeout`` of them together (module docstring)."""
    return now - heard_at - min(timeout, stalled(heard_at, now) + max(0.0, peer_lag))


def gone_silent(heard_at: float, now: float, timeout: float, stalled: Stalled = no_stall, peer_lag: float = 0.0,
                listen: float = defaults.LISTEN_AFTER_STALL) -> bool:
    """Whether a peer last heard at ``heard_at`` is gone at ``now``: its ``silence`` reached
    ``timeout`` and this node's loop ran ``listen`` s since ``heard_at`` (module docstring)."""
    ran = now - heard_at - stalled(heard_at, now)
    return silence(heard_at, now, timeout, stalled, peer_lag) >= timeout and ran >= min(listen, timeout)


def reported_lag(hb: Heartbeat) -> float:
    """The sender's own loop lag its heartbeat reports, in seconds (``Heartbeat.lag_ms``)."""
    return max(0, hb.lag_ms) / 1000


class Stalls:
    """This node's recent loop stalls, ``(start, end)`` monotonic seconds, the last
    ``keep`` of them (older ones fall off: they are older than any timeout), plus the one
    going on: ``due`` is when the watch (``exo_p2p.node.loop_watch``) expects to run next, so a
    task that runs before the watch after a stall (the election, say) counts it already."""

    def __init__(self, keep: int = 256) -> None:
        self._stalls: deque[tuple[float, float]] = deque(maxlen=keep)
        self.due: float | None = None

    def add(self, start: float, end: float) -> None:
        self._stalls.append((start, end))

    def between(self, t0: float, t1: float) -> float:
        ongoing = () if self.due is None or t1 <= self.due else ((self.due, t1),)
        return stalled_between((*self._stalls, *ongoing), t0, t1)

    def longest_since(self, t0: float) -> float:
        """The longest stall (seconds) that ended at ``t0`` or later: what this node's
        heartbeat reports as its own lag (``Heartbeat.lag_ms``); 0.0 when none."""
        return max((end - start for start, end in self._stalls if end >= t0), default=0.0)


@dataclass
class Liveness:
    """Latest heartbeat per peer and when (receiver's monotonic seconds) it arrived."""

    timeout: float
    stalled: Stalled = no_stall
    """This node's own loop stalls (module docstring); none by default."""
    _last: dict[str, tuple[float, Heartbeat]] = field(default_factory=dict)

    def heard(self, hb: Heartbeat, now: float) -> bool:
        """Record ``hb``; True when the peer was not alive before (it is new or came back).
        A heartbeat its sender made before the one held (same boot, smaller ``seq``: a
        replayed or reordered message) is ignored: it would turn the peer's view back (a
        joining node was replayed its master's heartbeat from before it was master, and
        dropped that master for one election pass)."""
        previous = self._last.get(hb.node_id)
        if previous is not None and previous[1].boot_id == hb.boot_id and hb.seq < previous[1].seq:
            return False
        self._last[hb.node_id] = (now, hb)
        return previous is None or now - previous[0] >= self.timeout or previous[1].boot_id != hb.boot_id

    def alive(self, now: float) -> list[Heartbeat]:
        """Heartbeats of the peers heard within ``timeout``, by node id."""
        return [hb for t, hb in sorted(self._last.values(), key=lambda x: x[1].node_id)
                if not gone_silent(t, now, self.timeout, self.stalled, reported_lag(hb))]

    def gone(self, now: float) -> list[str]:
        """Peers last heard ``timeout`` or more seconds ago (they stay listed until ``forget``)."""
        return sorted(n for n, (t, hb) in self._last.items()
                      if gone_silent(t, now, self.timeout, self.stalled, reported_lag(hb)))

    def last_heard(self, node_id: str) -> float | None:
        entry = self._last.get(node_id)
        return None if entry is None else entry[0]

    def get(self, node_id: str) -> Heartbeat | None:
        entry = self._last.get(node_id)
        return None if entry is None else entry[1]

    def forget(self, node_id: str) -> None:
        self._last.pop(node_id, None)
