"""The prober: this node measures every address of every peer, rarely, and publishes what moved
(docs/links.md).

Loop (``Prober.run``): every ``TICK`` s, each connected peer whose round is due gets one round:
tickets for its addresses over the cluster's own connection (``probe_server.TICKET_PROTOCOL``),
then each address measured in turn (``measure.measure``): RTT always, bandwidth when
``figures.bandwidth_due``. A round is due ``figures.RTT_EVERY`` s after the last one, or at once
when the peer's addresses changed (``RETRY_SOON`` s after an address refused or the tickets
could not be had). What the round found becomes events by the pure rule
``round_events``: ``LinkMeasured`` for a new address at once, and when the figures ``moved``
against State's in two rounds in a row (one round's move is often the node's own load: a busy
event loop answers late), ``LinkLost`` when
an address State has figures for refused connections ``LOSE_AFTER`` rounds in a row. Probes go
only to addresses the peer lists in its profile (``probe_targets``), and the peer proves it
holds the ticket before anything is timed.
"""

from __future__ import annotations

import ipaddress
import random
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import msgspec
import structlog
import trio

from exo_p2p.links.figures import RTT_EVERY, bandwidth_due, moved
from exo_p2p.links.measure import Inconclusive, Unreachable, measure
from exo_p2p.links.probe_server import TICKET_PROTOCOL, ProbeTicket, TicketRequest
from exo_p2p.types import Event, LinkFigures, LinkLost, LinkMeasured, NodeId, State
from exo_p2p.types.topology import MAX_ADDRESSES

log = structlog.get_logger(__name__)

TICK = 1.0
"""Seconds between two looks for due rounds."""
LOSE_AFTER = 2
"""Rounds in a row an address must refuse connections before its figures are retracted."""
TICKET_TIMEOUT = 5.0
"""Seconds a ticket request may take."""
RETRY_SOON = 2.0
"""Seconds to the next round after an address refused a connection, or after the ticket
request failed (the cluster's connection ran over the link that went down and is being
replaced): a lost link is noticed in a few times this, not in rounds of ``RTT_EVERY``."""


@dataclass
class AddressMemory:
    """What the prober remembers of one address between rounds (node-local, not State)."""

    refused: int = 0
    unconfirmed: LinkFigures | None = None
    bandwidth: int | None = None
    bandwidth_at: float | None = None
    bandwidth_rtt: int | None = None


@dataclass
class PeerMemory:
    """Per peer: when its next round is due, the addresses of its last round, and each one's memory."""

    due: float = 0.0
    targets: tuple[tuple[str, str], ...] = ()
    addresses: dict[str, AddressMemory] = field(default_factory=dict)


def probe_targets(state: State, own: NodeId, peer: NodeId) -> tuple[tuple[str, str], ...]:
    """(IPv4, interface type) of each address ``peer`` lists (at most ``MAX_ADDRESSES``, in
    order): never a wildcard, and loopback only when this node reaches the peer on loopback
    (same host: another host's 127.0.0.1 is this host)."""
    profile = state.nodes.get(peer)
    if profile is None:
        return ()
    edge = state.edges.get(own, {}).get(peer)
    same_host = edge is not None and _is_loopback(edge.address)
    out: list[tuple[str, str]] = []
    for addr in profile.addrs:
        ip = addr.ip
        try:
            parsed = ipaddress.ip_address(ip)
        except ValueError:
            continue
        if parsed.version != 4 or parsed.is_unspecified or (parsed.is_loopback and not same_host):
            continue
        if ip not in (t[0] for t in out):
            out.append((ip, addr.interface_type))
    return tuple(out[:MAX_ADDRESSES])


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split(":")[0]).is_loopback
    except ValueError:
        return False


Outcome = tuple[int, int | None] | Unreachable | Inconclusive
"""A measurement's result: (RTT µs, bytes/s or None), or why there is none."""


def round_events(state: State, own: NodeId, peer: NodeId, outcomes: dict[str, tuple[str, Outcome]],
                 memory: PeerMemory, listed: Collection[str] | None = None) -> list[Event]:
    """The events one round's ``outcomes`` (per IP: interface type, outcome) call for, against
    State's figures (module docstring); updates ``memory``'s refusal counts. ``listed``: the
    addresses the peer lists now (default: those of ``outcomes``); State's figures of any
    other address are retracted."""
    known = state.links.get(own, {}).get(peer, {})
    events: list[Event] = []
    for ip, (itype, outcome) in outcomes.items():
        mem = memory.addresses.setdefault(ip, AddressMemory())
        if isinstance(outcome, Unreachable):
            mem.refused += 1
            if ip in known and mem.refused >= LOSE_AFTER:
                events.append(LinkLost(own, peer, ip))
            continue
        if isinstance(outcome, Inconclusive):
            continue
        mem.refused = 0
        rtt, bw = outcome
        old = known.get(ip)
        figures = LinkFigures(ip, rtt, bw if bw is not None else (old.bytes_per_s if old else mem.bandwidth),
                              itype)  # type: ignore[arg-type]
        if not moved(old, figures):
            mem.unconfirmed = None
        elif old is None or mem.unconfirmed is not None and moved(old, mem.unconfirmed):
            mem.unconfirmed = None  # news, or a move the previous round saw too
            events.append(LinkMeasured(own, peer, figures))
        else:
            mem.unconfirmed = figures  # a move is published when the next round confirms it
    for ip in sorted(set(known) - set(outcomes if listed is None else listed)):  # the peer no longer lists it
        events.append(LinkLost(own, peer, ip))
    return events


class Prober:
    """Measures the links from this node (module docstring). ``net``: ``request``,
    ``connected_peers``; ``state()``: the current State; ``send(event)``: a local event."""

    def __init__(self, net, node_id: NodeId, state: Callable[[], State], send: Callable[[Event], None], *,  # type: ignore[no-untyped-def]
                 clock: Callable[[], float] = time.monotonic, every: float = RTT_EVERY) -> None:
        self.net, self.node_id, self.state, self.send, self.clock, self.every = net, node_id, state, send, clock, every
        self.peers: dict[NodeId, PeerMemory] = {}
        self.rounds = 0
        self.events = 0

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            busy: set[NodeId] = set()
            while True:
                await trio.sleep(TICK)
                state, now = self.state(), self.clock()
                connected = self.net.connected_peers()
                for peer in sorted(state.nodes):
                    if peer == self.node_id or peer in busy or peer not in connected or self.node_id not in state.nodes:
                        continue
                    mem = self.peers.setdefault(peer, PeerMemory())
                    targets = probe_targets(state, self.node_id, peer)
                    if targets and (now >= mem.due or targets != mem.targets):
                        busy.add(peer)
                        nursery.start_soon(self._round, peer, targets, mem, busy)
                for gone in set(self.peers) - set(state.nodes):
                    del self.peers[gone]

    async def _round(self, peer: NodeId, targets: tuple[tuple[str, str], ...], mem: PeerMemory, busy: set[NodeId]) -> None:
        """One round of ``peer`` (module docstring); whatever fails in it is logged, never
        raised into the node: the next round is due as usual."""
        try:
            await self._measure_peer(peer, targets, mem)
        except Exception as exc:  # noqa: BLE001 - a measuring bug must not stop the node
            log.warning("link round failed", peer=peer, error=repr(exc))
        finally:
            busy.discard(peer)

    async def _measure_peer(self, peer: NodeId, targets: tuple[tuple[str, str], ...], mem: PeerMemory) -> None:
        """One round: tickets, each address measured, the events that calls for."""
        mem.targets = targets
        mem.due = self.clock() + self.every * random.uniform(0.9, 1.1)  # noqa: S311 - spreading, not security
        try:
            reply = await self.net.request(peer, TICKET_PROTOCOL, msgspec.msgpack.encode(TicketRequest(len(targets))),
                                           timeout=TICKET_TIMEOUT)
            ticket = msgspec.msgpack.decode(reply, type=ProbeTicket)
        except Exception as exc:  # noqa: BLE001 - the peer is busy, gone, or its connection died: soon again
            log.debug("no probe ticket", peer=peer, error=repr(exc))
            mem.due = min(mem.due, self.clock() + RETRY_SOON)
            return
        outcomes: dict[str, tuple[str, Outcome]] = {}
        for (ip, itype), (token, proof) in zip(targets, ticket.tickets, strict=False):
            amem = mem.addresses.setdefault(ip, AddressMemory())
            outcomes[ip] = (itype, await self._measure(ip, ticket.port, token, proof, amem))
        self.rounds += 1
        if any(isinstance(o, Unreachable) for _, o in outcomes.values()):
            mem.due = min(mem.due, self.clock() + RETRY_SOON)
        for event in round_events(self.state(), self.node_id, peer, outcomes, mem, [ip for ip, _ in targets]):
            self.events += 1
            log.info("link figures", peer=peer, kind=type(event).__name__,
                     figures=msgspec.to_builtins(getattr(event, "figures", None)))
            self.send(event)

    async def _measure(self, ip: str, port: int, token: bytes, proof: bytes, amem: AddressMemory) -> Outcome:
        now = self.clock()

        def due(rtt: int) -> bool:
            return bandwidth_due(last_rtt_us=amem.bandwidth_rtt, rtt_us=rtt, measured_at=amem.bandwidth_at, now=now)

        try:
            rtt, bw = await measure(ip, port, token, proof, bandwidth=due)
        except (Unreachable, Inconclusive) as exc:
            log.debug("link probe failed", ip=ip, error=repr(exc))
            return exc
        if bw is not None:
            amem.bandwidth, amem.bandwidth_at, amem.bandwidth_rtt = bw, now, rtt
        return rtt, bw
