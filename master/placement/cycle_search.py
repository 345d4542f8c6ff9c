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
from master.placement.cost import CostModel, Path, assumed_path, hop_cost_us, ring_cost_us
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
        self._costs: dict[CostModel, tuple[list[LazyCosts], list[LazyCosts], int]] = {}
        self._figures: set[tuple[int, int]] | None = None

    def costs(self, model: CostModel) -> tuple[list[LazyCosts], list[LazyCosts], int]:
        """Per node index, the cost (µs) of each out-link as a forward hop and as the closing hop
        under ``model`` (``LazyCosts``: each computed when a search first asks for it, as a
        search of a few ranks looks at a few of the N² links), and the cheapest hop cost of the
        graph (a bound for any hop: the cheapest of its addresses' figures)."""
        if model not in self._costs:
            fwd = [LazyCosts(outs, model.hop_bytes) for outs in self.link_of]
            close = [LazyCosts(outs, model.close_bytes) for outs in self.link_of]
            cheapest = min((hop_cost_us(Path("", rtt, bw, measured=False), n) for rtt, bw in self.figures()
                            for n in (model.hop_bytes, model.close_bytes)), default=0)
            self._costs[model] = (fwd, close, cheapest)
        return self._costs[model]

    def figures(self) -> set[tuple[int, int]]:
        """The distinct (RTT µs, bytes/s) of every address of every link (computed once)."""
        if self._figures is None:
            self._figures = {(p.rtt_us, p.bytes_per_s) for outs in self.link_of for link in outs.values()
                             for p in (link.paths or (assumed_path(link.ip, "other"),))}
        return self._figures

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


class LazyCosts:
    """The costs (µs) of moving ``nbytes`` over each of one node's out-links (``links``: sink
    index → ``Link``), each computed on first ``[sink]`` and kept. ``KeyError`` for a sink
    without a link, like the dict it replaces."""

    __slots__ = ("_links", "_nbytes", "_done")

    def __init__(self, links: Mapping[int, Link], nbytes: int) -> None:
        self._links, self._nbytes = links, nbytes
        self._done: dict[int, int] = {}

    def __getitem__(self, sink: int) -> int:
        cost = self._done.get(sink)
        if cost is None:
            cost = self._done[sink] = self._links[sink].cost(self._nbytes)
        return cost


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
