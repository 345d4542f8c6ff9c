"""The choice order of cycles (docs/architecture.md#rules "Link cost"): rank order and the key.

A cycle of a ``Topology`` is written in rank order (``rank_order``: rank 0 is its heaviest
member). ``cycle_key`` sorts cycles, smaller first, by the ring's network cost per token
(``ring_cost``, ``master.placement.cost``), then link quality, then memory, then node ids: the
order in which placement (``master.placement.place``) takes candidates and that the search
(``master.placement.cycle_search``) bounds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from exo_p2p.types import NodeId
from master.placement.cost import CostModel, ring_cost_us
from master.placement.topology import BEST_LINK_RANK, Topology

CycleKey = tuple[int, int, int, int, tuple[tuple[int, str], ...]]
"""Sort key of a cycle (smaller is better): ``(network cost per token in µs, -worst link rank,
-sum of link ranks, -sum of node weights, ((-weight, id) of each node in rank order))``. See
``cycle_key``."""


def rank_order(cycle: Iterable[NodeId], weights: Mapping[NodeId, int]) -> tuple[NodeId, ...]:
    """``cycle`` rotated to start at its member with the largest weight (ties: the smallest
    node id) — rank 0 — with the cycle's direction kept."""
    nodes = tuple(cycle)
    start = min(range(len(nodes)), key=lambda i: (-weights[nodes[i]], nodes[i]))
    return nodes[start:] + nodes[:start]


def ring_cost(topology: Topology, cycle: tuple[NodeId, ...], model: CostModel | None) -> int:
    """The network cost per token (µs) of ``cycle`` (rank order) under ``model``, each hop over
    its cheapest address (``master.placement.cost``); 0 without a model or for one node."""
    if model is None or len(cycle) < 2:
        return 0
    hops = [topology.links[cycle[i]][cycle[i + 1]].cost(model.hop_bytes) for i in range(len(cycle) - 1)]
    return ring_cost_us(model, hops, topology.links[cycle[-1]][cycle[0]].cost(model.close_bytes))


def cycle_key(
    topology: Topology, cycle: tuple[NodeId, ...], weights: Mapping[NodeId, int], *, rank_links: bool = True,
    cost: CostModel | None = None,
) -> CycleKey:
    """The choice-order key of ``cycle`` (a cycle of ``topology`` in rank order); smaller is better.

    In order: the ring's network cost per token under ``cost`` (``ring_cost``; 0 without a
    model or with ``rank_links=False``), the worst link of the cycle (higher rank first), the sum of its link ranks, the
    sum of ``weights`` (more first), and last the tuple of ``(-weight, node id)`` of the nodes
    in rank order: the cycle whose rank 0, then rank 1, ... is heavier, ties to the smaller
    node id (on equal nodes: the smallest ids, visited in ascending order). A single node has
    no link: worst = the best rank, sum 0. With ``rank_links=False`` both link components are
    0 (memory only).

    (The last component replaces "sorted node ids": it is a total order that the search can
    bound from a path prefix, so ties between equal machines are cut instead of explored.)
    """
    worst, total = BEST_LINK_RANK, 0
    if rank_links and len(cycle) > 1:
        ranks = [topology.links[cycle[i - 1]][cycle[i]].rank for i in range(len(cycle))]
        worst, total = min(ranks), sum(ranks)
    if not rank_links:
        worst = 0
    price = ring_cost(topology, cycle, cost) if rank_links else 0
    return (price, -worst, -total, -sum(weights[n] for n in cycle), tuple((-weights[n], n) for n in cycle))
