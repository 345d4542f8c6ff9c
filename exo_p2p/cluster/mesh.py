"""The mesh keeper: dial every node in State (a full mesh: commands, chunks and log sync
reach any peer directly), and keep State's topology edges from this node equal to its
connections.

Rules:
- ``dial_plan``: a node not connected is dialled at once when this node's id is smaller or
  it was known at boot (it cannot dial us: we may listen on a new port, and our election waits
  for it), else after ``MESH_STAGGER`` s (so a pair does not open two connections at once);
  then with a backoff doubling from ``MESH_BACKOFF_FIRST`` to ``MESH_BACKOFF_MAX`` s.
- An edge this node→peer is announced on connection, with the IP the peer is reached at
  (``ip_of``: the peerstore's, else the peer's profile), together with the other edges that
  came within ``EDGE_BATCH_WAIT`` s (one ``TopologyEdgesCreated``); retracted when the peer stays
  disconnected ``EDGE_RETRACT_GRACE`` s.
- ``edge_changes`` (every ``EDGE_RECONCILE_PERIOD`` s, while a master is followed): announce an
  edge to a connected peer in State that has none and none on its way; retract an edge in
  State to a peer disconnected for the grace. Whatever happened in between (a peer timed out
  while it reconnected, a log replaced by another master's) is repaired.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping

import structlog
import trio

from exo_p2p import defaults
from exo_p2p.cluster.common import Role
from exo_p2p.cluster.heartbeats import PeerView
from exo_p2p.cluster.outbox import LocalOutbox
from exo_p2p.replica import Replica
from exo_p2p.types import Event, TopologyEdge, TopologyEdgeCreated, TopologyEdgeDeleted, TopologyEdgesCreated
from exo_p2p.types.events import MAX_EDGES_PER_EVENT

log = structlog.get_logger(__name__)

Backoff = dict[str, tuple[float, float]]
"""Per node: (when to dial next, seconds of backoff after that dial)."""


def dial_plan(nodes: Iterable[str], *, own: str, connected: Collection[str], known_at_boot: Collection[str],
              backoff: Backoff, now: float) -> list[str]:
    """The nodes to dial now (module docstring); updates ``backoff`` in place."""
    out: list[str] = []
    for node_id in nodes:
        if node_id == own or node_id in connected:
            backoff.pop(node_id, None)
            continue
        stagger = 0.0 if own < node_id or node_id in known_at_boot else defaults.MESH_STAGGER
        when, wait = backoff.setdefault(node_id, (now + stagger, defaults.MESH_BACKOFF_FIRST))
        if now < when:
            continue
        backoff[node_id] = (now + wait, min(defaults.MESH_BACKOFF_MAX, wait * 2))
        out.append(node_id)
    return out


def on_the_way(pending: Iterable[Event]) -> set[str]:
    """Peers with an edge event among this node's ``pending`` local events."""
    out: set[str] = set()
    for ev in pending:
        if isinstance(ev, TopologyEdgesCreated):
            out.update(e.sink for e in ev.edges)
        elif isinstance(ev, (TopologyEdgeCreated, TopologyEdgeDeleted)):
            out.add(ev.edge.sink if isinstance(ev, TopologyEdgeCreated) else ev.sink)
    return out


def edge_changes(*, mine: Collection[str], in_state: Collection[str], connected: Collection[str], on_the_way: Collection[str],
                 announcing: Collection[str], disconnected_at: Mapping[str, float], started_at: float, now: float,
                 grace: float) -> tuple[set[str], set[str]]:
    """(peers to announce an edge to, peers whose edge to retract); ``mine``: the sinks of
    State's edges from this node (module docstring)."""
    busy = set(on_the_way) | set(announcing)
    announce = {p for p in connected if p in in_state and p not in mine and p not in busy}
    retract = {
        p for p in mine
        if p not in connected and p not in on_the_way and now - disconnected_at.get(p, started_at) >= grace
    }
    return announce, retract


def ip_of(addrs: list[str]) -> str:
    """The first concrete IPv4 address of ``addrs`` (never ``0.0.0.0``: a topology edge's IP
    is where placement makes a ring rank listen)."""
    for a in addrs:
        parts = a.split("/")
        if len(parts) > 2 and parts[1] == "ip4" and parts[2] != "0.0.0.0":
            return parts[2]
    return ""


class MeshKeeper:
    """``run()``: dial, watch connections, reconcile edges; ``reannounce_all()`` after the
    log was replaced. Edges are local events (``outbox``)."""

    def __init__(self, net, replica: Replica, role: Role, peers: PeerView, outbox: LocalOutbox,  # type: ignore[no-untyped-def]
                 clock: Callable[[], float]) -> None:
        self.net, self.replica, self.role, self.peers, self.outbox, self.clock = net, replica, role, peers, outbox, clock
        self.node_id = role.node_id
        self.known_at_boot = frozenset(replica.state.nodes)
        self.announced: set[str] = set()
        self.announcing: set[str] = set()
        self.backoff: Backoff = {}
        self.queued: list[TopologyEdge] = []
        """Edges found, waiting ``EDGE_BATCH_WAIT`` s to leave together (``_flush_loop``)."""
        self._queued_wake = trio.Event()
        self._nursery: trio.Nursery | None = None

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._dial_loop)
            nursery.start_soon(self._connection_loop)
            nursery.start_soon(self._reconcile_loop)
            nursery.start_soon(self._flush_loop)

    async def _flush_loop(self) -> None:
        """Announce the queued edges together, ``EDGE_BATCH_WAIT`` s after the first came."""
        while True:
            await self._queued_wake.wait()
            await trio.sleep(defaults.EDGE_BATCH_WAIT)
            self._queued_wake = trio.Event()
            edges, self.queued = self.queued, []
            for start in range(0, len(edges), MAX_EDGES_PER_EVENT):
                self.outbox.send(TopologyEdgesCreated(tuple(edges[start:start + MAX_EDGES_PER_EVENT])))

    def reannounce_all(self, _state: object = None) -> None:
        self.announced.clear()
        if self._nursery is not None:
            for peer in self.net.connected_peers():
                self._nursery.start_soon(self._announce, peer)

    async def _dial_loop(self) -> None:
        while True:
            await trio.sleep(defaults.MESH_TICK)
            nodes = self.replica.state.nodes
            plan = dial_plan(list(nodes), own=self.node_id, connected=self.net.connected_peers(),
                             known_at_boot=self.known_at_boot, backoff=self.backoff, now=self.clock())
            for node_id in plan:
                await self._dial(node_id, [a.multiaddr for a in nodes[node_id].addrs])  # type: ignore[index]

    async def _dial(self, node_id: str, addrs: list[str]) -> None:
        for addr in addrs:
            try:
                await self.net.dial(addr, timeout=defaults.MESH_DIAL_TIMEOUT)
                return
            except Exception as exc:  # noqa: BLE001 - unreachable now; retried with backoff
                log.debug("mesh dial failed", peer=node_id, addr=addr, error=repr(exc))

    async def _connection_loop(self) -> None:
        assert self._nursery is not None
        async for peer, connected in self.net.peer_events():
            if connected:
                self.peers.disconnected_at.pop(peer, None)
                if peer not in self.announced:
                    self._nursery.start_soon(self._announce, peer)
            else:
                self.peers.disconnected_at[peer] = self.clock()
                self._nursery.start_soon(self._retract, peer)

    async def _reconcile_loop(self) -> None:
        while True:
            await trio.sleep(defaults.EDGE_RECONCILE_PERIOD)
            state = self.replica.state
            if self.role.master is None or self.node_id not in state.nodes or self._nursery is None:
                continue
            announce, retract = edge_changes(
                mine=state.edges.get(self.node_id, {}), in_state=state.nodes,  # type: ignore[call-overload]
                connected=set(self.net.connected_peers()),
                on_the_way=on_the_way(self.outbox.pending_events()) | {e.sink for e in self.queued},
                announcing=self.announcing, disconnected_at=self.peers.disconnected_at,
                started_at=self.peers.started_at, now=self.clock(), grace=defaults.EDGE_RETRACT_GRACE,
            )
            for peer in announce:
                self.announced.discard(peer)
                self._nursery.start_soon(self._announce, peer)
            for peer in retract:
                self.announced.discard(peer)
                self.outbox.send(TopologyEdgeDeleted(self.node_id, peer))  # type: ignore[arg-type]

    async def _retract(self, peer: str) -> None:
        await trio.sleep(defaults.EDGE_RETRACT_GRACE)
        if peer not in self.net.connected_peers() and peer in self.announced:
            self.announced.discard(peer)
            self.queued = [e for e in self.queued if e.sink != peer]
            self.outbox.send(TopologyEdgeDeleted(self.node_id, peer))  # type: ignore[arg-type]

    def _peer_ip(self, peer: str) -> str:
        ip = ip_of(self.net.peer_addrs(peer))
        if not ip:
            profile = self.replica.state.nodes.get(peer)  # type: ignore[call-overload]
            ip = ip_of([a.multiaddr for a in profile.addrs]) if profile is not None else ""
        return ip

    async def _announce(self, peer: str) -> None:
        """Record the edge this node→``peer``, waiting up to ``EDGE_ADDRESS_WAIT`` s for its IP
        (an edge without an address is useless for ring placement)."""
        if peer in self.announcing:
            return
        self.announcing.add(peer)
        try:
            with trio.move_on_after(defaults.EDGE_ADDRESS_WAIT):
                while peer in self.net.connected_peers():
                    if ip := self._peer_ip(peer):
                        if peer not in self.announced:
                            self.announced.add(peer)
                            self.queued.append(TopologyEdge(self.node_id, peer, ip))  # type: ignore[arg-type]
                            self._queued_wake.set()
                        return
                    await trio.sleep(defaults.EDGE_ADDRESS_POLL)
                return
            log.warning("no address known for peer; no topology edge", peer=peer)
        finally:
            self.announcing.discard(peer)
