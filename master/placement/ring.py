"""Ring addresses of a placed instance: the IP and port each rank listens at.

Rank r listens at ``ip:port``: ``ip`` is the cheapest address of the link rank r-1 → rank r
for the bytes that hop carries (``ring_ips``; chosen once, at placement, so both neighbours
see the same), ``port`` the first in ``[RING_BASE_PORT, RING_BASE_PORT + RING_PORT_SPAN)``
from an offset derived from the instance id (``first_port``) that no shard of an existing
instance uses on that node, nor any shard (or an earlier rank of this instance) at that IP
(``ring_addresses``).
"""

from __future__ import annotations

import hashlib

from exo_p2p.types import NodeId, State
from master.placement.context import PlacementError, label
from master.placement.cost import CostModel
from master.placement.topology import Topology

RING_BASE_PORT = 29600
"""Lowest port a ring member listens on. Below Linux's ephemeral range (32768–60999) and
macOS's (49152–65535): a ring port inside it is often held by some client connection's
local port or its TIME_WAIT (a test polling HTTP APIs leaves hundreds), and MLX's ring then
fails to bind it ("Couldn't bind socket (error: 98)")."""
RING_PORT_SPAN = 1000
"""Ring ports are chosen in ``[RING_BASE_PORT, RING_BASE_PORT + RING_PORT_SPAN)``."""


def used_addresses(state: State) -> set[str]:
    """Ring addresses (``ip:port``) taken by the shards of existing instances."""
    return {shard.ring_address for inst in state.instances.values() for shard in inst.shards if shard.ring_address}


def first_port(instance_id: str) -> int:
    """Where an instance starts looking for ring ports: ``RING_BASE_PORT`` plus an offset
    derived from its id. A new instance (a re-placement, or a placement right after a
    deletion) thus rarely reuses the ports of the one before it, whose sockets the kernel
    may still hold (TIME_WAIT) — MLX's ring cannot bind a port in that state."""
    digest = hashlib.sha256(instance_id.encode()).digest()
    return RING_BASE_PORT + int.from_bytes(digest[:4], "big") % RING_PORT_SPAN


def ring_ips(topology: Topology, cycle: tuple[NodeId, ...], model: CostModel) -> list[tuple[str, bool]]:
    """Per rank, (the IP its ring predecessor reaches it at, whether that address was measured):
    the cheapest address of the link for the bytes the hop carries (rank 0's: the closing hop)."""
    out = []
    for rank in range(len(cycle)):
        link = topology.link(cycle[rank - 1], cycle[rank])
        assert link is not None  # the search only returns cycles of the topology
        path = link.best(model.close_bytes if rank == 0 else model.hop_bytes)
        out.append((path.ip, path.measured))
    return out


def ring_addresses(state: State, topology: Topology, cycle: tuple[NodeId, ...], instance_id: str, model: CostModel) -> list[str]:
    """Per rank, ``ip:port`` where the rank listens: the IP at which its ring predecessor
    reaches it (one address per link, the cheapest under ``model`` (``ring_ips``), chosen
    here once, so both ranks of a link agree) and
    the first port from ``first_port(instance_id)`` on (wrapping within
    ``[RING_BASE_PORT, RING_BASE_PORT + RING_PORT_SPAN)``) not used on that node by an
    existing instance, nor at that IP by any instance or an earlier rank of this one
    (several nodes can share an IP: processes on one machine)."""
    if len(cycle) == 1:
        return [""]
    taken = used_addresses(state)
    out = []
    for rank, (ip, _) in enumerate(ring_ips(topology, cycle, model)):
        host = f"[{ip}]" if ":" in ip else ip
        node_ports = used_ports(state, cycle[rank])
        start = first_port(instance_id) - RING_BASE_PORT
        for step in range(RING_PORT_SPAN):
            port = RING_BASE_PORT + (start + step) % RING_PORT_SPAN
            if port not in node_ports and f"{host}:{port}" not in taken:
                break
        else:
            raise PlacementError(f"no free ring port on node {label(state, cycle[rank])} at {ip}")
        address = f"{host}:{port}"
        taken.add(address)
        out.append(address)
    return out


def used_ports(state: State, node: NodeId) -> set[int]:
    """Ports the shards of existing instances on ``node`` listen on (at any IP)."""
    ports: set[int] = set()
    for inst in state.instances.values():
        for shard in inst.shards:
            if shard.node_id == node and ":" in shard.ring_address:
                port = shard.ring_address.rsplit(":", 1)[1]
                if port.isdigit():
                    ports.add(int(port))
    return ports
