"""The prepared graph of a cycle search (docs/architecture.md#vocabulary "cycle").

``CycleSearch`` indexes one ``Topology`` and one set of node weights once (nodes in weight
order, successors best link first, predecessors, hop costs per cost model, distances back
to each start) so that every search of a placement request reuses it: the exact branch and
bound (``master.placement.branch_and_bound``) and the budgeted sweep beyond 8 nodes
(``master.placement.cycle_sweep``). A search's answer is a ``Found`` cycle in rank order with
its ``cycle_key`` (``master.placement.cycle_order``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from exo_p2p.types import NodeId
from master.placement.cost import CostModel, ring_cost_us
from master.placement.cycle_order import CycleKey
from master.placement.topology import BEST_LINK_RANK, Link, Topology

T = TypeVar("T")


@dataclass(frozen=True)
class Found(Generic[T]):
    """The best cycle a search accepted: its ``key``, the ``cycle`` in rank order and what the
    ``accept`` function returned for it."""

    key: CycleKey
    cycle: tuple[NodeId, ...]
    payload: T


@dataclass(frozen=True)
class SearchOutcome(Generic[T]):
    """``best`` is None when no cycle was accepted; ``exhausted`` is True when the budget ran
    out (then ``best`` may not be the best, and None may not mean "none exists")."""

    best: Found[T] | None
    exhausted: bool
    expansions: int


class CycleSearch:
    """A graph prepared for cycle searches: one ``topology`` and one set of node ``weights``
    (bytes; nodes without a weight are not used), reused for every size and request.
    ``rank_links=False`` ignores link quality (the key's link components are 0: memory, then
    ids). The network cost (the key's first component) is given per search as a ``CostModel``;
    its hop costs are computed once per model and cached (``costs``).

    Nodes are indexed in weight order (weight desc, id asc): ``order[i]`` is node ``i``, ``w[i]``
    its weight, ``succ[i]`` its out-links as ``(j, rank)`` best link first, ``rank_of[i][j]``
    and ``link_of[i][j]`` the link i→j, ``preds[j]`` the nodes with a link to j.
    """

    def __init__(self, topology: Topology, weights: Mapping[NodeId, int], *, rank_links: bool = True) -> None:
        self.order = sorted((n for n in topology.nodes if n in weights), key=lambda n: (-weights[n], n))
        self.index = {node: i for i, node in enumerate(self.order)}
        self.w = [weights[n] for n in self.order]
        self.succ: list[list[tuple[int, int]]] = []
        self.rank_of: list[dict[int, int]] = []
        self.link_of: list[dict[int, Link]] = []
        top = 0
        for node in self.order:
            self.link_of.append({self.index[t]: link for t, link in topology.links.get(node, {}).items() if t in self.index})
            outs = [
                (self.index[t], link.rank if rank_links else 0)
                for t, link in topology.links.get(node, {}).items()
                if t in self.index
            ]
            outs.sort(key=lambda item: (-item[1], item[0]))
            self.succ.append(outs)
            self.rank_of.append(dict(outs))
            top = max([top] + [r for _, r in outs])
        self.preds: list[list[int]] = [[] for _ in self.order]
        for i, outs in enumerate(self.succ):
            for j, _ in outs:
                self.preds[j].append(i)
        self.rank_links = rank_links
        self.max_rank = top
        self.single_rank = BEST_LINK_RANK if rank_links else 0
        self._dist: dict[int, list[int]] = {}
        self._costs: dict[CostModel, tuple[list[dict[int, int]], list[dict[int, int]], int]] = {}

    def costs(self, model: CostModel) -> tuple[list[dict[int, int]], list[dict[int, int]], int]:
        """Per node index, the cost (µs) of each out-link as a forward hop and as the closing hop
        under ``model``, and the cheapest closing cost of the graph (a bound for any hop)."""
        if model not in self._costs:
            fwd = [{j: link.cost(model.hop_bytes) for j, link in outs.items()} for outs in self.link_of]
            close = [{j: link.cost(model.close_bytes) for j, link in outs.items()} for outs in self.link_of]
            cheapest = min((c for outs in close for c in outs.values()), default=0)
            self._costs[model] = (fwd, close, min(cheapest, min((c for o in fwd for c in o.values()), default=0)))
        return self._costs[model]

    def path_cost(self, path: list[int], model: CostModel | None) -> int:
        """The ring cost of the index cycle ``path`` (rank order) under ``model`` (0 for None)."""
        if model is None or len(path) < 2:
            return 0
        fwd, close, _ = self.costs(model)
        return ring_cost_us(model, [fwd[path[k]][path[k + 1]] for k in range(len(path) - 1)], close[path[-1]][path[0]])

    def distances(self, start: int) -> list[int]:
        """``distances_to(start)``, cached per start."""
        if start not in self._dist:
            self._dist[start] = distances_to(start, self.preds, len(self.order))
        return self._dist[start]


def distances_to(start: int, preds: list[list[int]], count: int) -> list[int]:
    """Fewest edges from each node (index >= start) to ``start`` over nodes >= start."""
    far = count + 1
    dist = [far] * count
    dist[start] = 0
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for u in preds[v]:
            if u > start and dist[u] == far:
                dist[u] = dist[v] + 1
                queue.append(u)
    return dist
