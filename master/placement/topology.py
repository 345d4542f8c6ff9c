"""The topology graph placement searches (docs/architecture.md#vocabulary "topology").

A ``Topology`` is the directed reachability graph of State restricted to some nodes: an edge
A→B exists when State holds ``edges[A][B]`` with an address at which B can be dialled (an IP,
or a multiaddr / ``ip:port`` holding one). Edges without such an address are kept aside in
``unaddressed`` so errors can name the pair. Each usable edge is a ``Link`` carrying its
rank (``LINK_RANK``) and the figures of every address of the sink (``master.placement.cost``).

The order in which cycles of the graph are chosen is ``master.placement.cycle_order``; the search
for the best cycle is ``master.placement.cycle_search``.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from exo_p2p.types import NodeId, State
from master.placement.cost import Path, assumed_path, best_path, hop_cost_us, measured_path

LINK_RANK: Mapping[str, int] = {"thunderbolt": 3, "ethernet": 2, "wifi": 1, "loopback": 0, "other": 0}
"""How good a link is, by the edge's ``interface_type``: Thunderbolt > Ethernet > Wi-Fi > the
rest (loopback, unknown). Higher is better."""

BEST_LINK_RANK = max(LINK_RANK.values())


@dataclass(frozen=True, slots=True)
class Link:
    """A usable edge: the ``ip`` the source dials to reach the sink (the edge's address), its
    ``rank`` (``LINK_RANK`` of the edge's interface type) and every address of the sink it may
    use, with figures (``paths``: measured ones from ``State.links``, else the edge's address
    with the figures assumed for its type; ``master.placement.cost``)."""

    ip: str
    rank: int
    paths: tuple[Path, ...] = ()

    def best(self, nbytes: int) -> Path:
        """The cheapest address for ``nbytes`` per token (``master.placement.cost.best_path``)."""
        return best_path(self.paths or (assumed_path(self.ip, "other"),), nbytes)

    def cost(self, nbytes: int) -> int:
        """Microseconds to move ``nbytes`` over the cheapest address."""
        return hop_cost_us(self.best(nbytes), nbytes)


@dataclass(frozen=True)
class Topology:
    """Directed graph over ``nodes`` (sorted ids). ``links[a][b]`` is the edge a→b;
    ``unaddressed`` lists pairs (a, b) whose edge carries no usable address."""

    nodes: tuple[NodeId, ...]
    links: Mapping[NodeId, Mapping[NodeId, Link]]
    unaddressed: tuple[tuple[NodeId, NodeId], ...] = ()

    def link(self, source: NodeId, sink: NodeId) -> Link | None:
        """The edge source→sink, or None."""
        return self.links.get(source, {}).get(sink)

    def is_cycle(self, cycle: tuple[NodeId, ...]) -> bool:
        """True when ``cycle`` is a simple cycle of this graph (one node always is)."""
        if not cycle or len(set(cycle)) != len(cycle) or any(n not in self.links for n in cycle):
            return False
        if len(cycle) == 1:
            return True
        return all(self.link(cycle[i - 1], cycle[i]) is not None for i in range(len(cycle)))


@functools.lru_cache(maxsize=4096)
def ring_ip(address: str) -> str | None:
    """The IP in an edge address: a bare IPv4/IPv6, ``ip:port``, ``[v6]:port`` or a multiaddr
    (``/ip4/1.2.3.4/tcp/52514``). None when there is none (empty, a DNS name, garbage)."""
    text = address.strip()
    if text.startswith("/"):
        parts = text.split("/")
        if len(parts) >= 3 and parts[1] in ("ip4", "ip6"):
            text = parts[2]
        else:
            return None
    elif text.startswith("["):
        text = text[1 : text.find("]")] if "]" in text else ""
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def link_paths(state: State, source: NodeId, sink: NodeId, ip: str, interface_type: str) -> tuple[Path, ...]:
    """Every address of ``sink`` that ``source`` may use: each measured one (``State.links``);
    the edge's own ``ip``, with the figures assumed for its type, only while no address of the
    pair is measured. (The prober measures every address the sink lists, the edge's
    included: one without figures beside measured ones is new or lost — ``LinkLost`` — and
    a ring placed on a lost address fails at once.)"""
    measured = state.links.get(source, {}).get(sink, {})
    paths = [
        measured_path(got, f.interface_type, f.rtt_us, f.bytes_per_s)
        for address, f in sorted(measured.items())
        if (got := ring_ip(address)) is not None
    ]
    if not paths:
        paths.append(assumed_path(ip, interface_type))
    return tuple(paths)


def topology_from_state(state: State, among: Iterable[NodeId] | None = None) -> Topology:
    """The graph of ``state.edges`` restricted to ``among`` (default: every node in
    ``state.nodes``); self-edges and edges to nodes outside the set are dropped. Each link
    carries its addresses' figures (``link_paths``)."""
    keep = set(state.nodes if among is None else among)
    links: dict[NodeId, dict[NodeId, Link]] = {n: {} for n in sorted(keep)}
    unaddressed: list[tuple[NodeId, NodeId]] = []
    for source, sinks in state.edges.items():
        if source not in keep:
            continue
        for sink, edge in sinks.items():
            if sink not in keep or sink == source:
                continue
            ip = ring_ip(edge.address)
            if ip is None:
                unaddressed.append((source, sink))
            else:
                paths = link_paths(state, source, sink, ip, edge.interface_type)
                links[source][sink] = Link(ip, LINK_RANK.get(edge.interface_type, 0), paths)
    return Topology(tuple(sorted(keep)), links, tuple(sorted(unaddressed)))
