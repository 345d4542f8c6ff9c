"""Who is alive, by this node's monotonic clock only (docs/architecture.md#defaults; tests/test_election.py).

Each heartbeat received is stamped with the receiver's ``now`` (a monotonic clock injected
by the caller); a peer is alive while its last heartbeat is younger than ``timeout``
seconds. Wall clocks are never compared, so a peer whose clock is off by hours, or a slow
profile probe that does not stop heartbeats, never looks dead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exo_p2p.cluster.messages import Heartbeat


@dataclass
class Liveness:
    """Latest heartbeat per peer and when (receiver's monotonic seconds) it arrived."""

    timeout: float
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
        return [hb for t, hb in sorted(self._last.values(), key=lambda x: x[1].node_id) if now - t < self.timeout]

    def gone(self, now: float) -> list[str]:
        """Peers last heard ``timeout`` or more seconds ago (they stay listed until ``forget``)."""
        return sorted(n for n, (t, _) in self._last.items() if now - t >= self.timeout)

    def last_heard(self, node_id: str) -> float | None:
        entry = self._last.get(node_id)
        return None if entry is None else entry[0]

    def get(self, node_id: str) -> Heartbeat | None:
        entry = self._last.get(node_id)
        return None if entry is None else entry[1]

    def forget(self, node_id: str) -> None:
        self._last.pop(node_id, None)
