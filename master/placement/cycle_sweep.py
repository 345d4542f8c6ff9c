"""The budgeted sweep placement uses beyond 8 nodes: the best cycle met per length, in one search.

``sweep`` runs one depth-first search of a prepared ``CycleSearch`` shared by every cycle
length and every ``Goal`` (a sharding's fit, or "the heaviest cycle" for error messages), and
records per goal and length the best cycle it meets under the choice order
(``master.placement.cycle_order``). Unlike ``master.placement.branch_and_bound`` it is not exact:
see ``sweep`` for what it gives up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from exo_p2p.types import NodeId
from master.placement.cost import CostModel
from master.placement.cycle_search import CycleSearch, Found

T = TypeVar("T")


@dataclass(frozen=True)
class Goal(Generic[T]):
    """What ``sweep`` records: per length in ``sizes``, the best cycle weighing at
    least ``min_weight`` bytes that ``accept`` takes (returns a payload, or None to reject).
    ``rank_links=False`` ranks by memory only (the key's link components are 0); ``cost`` gives the
    network cost model per length."""

    accept: Callable[[tuple[NodeId, ...]], T | None]
    sizes: frozenset[int]
    min_weight: int = 0
    rank_links: bool = True
    cost: Callable[[int], CostModel | None] | None = None
    """Per cycle length, the network cost model of the key's first component (None: 0)."""


def sweep(
    graph: CycleSearch,
    goals: list[Goal],
    *,
    required: frozenset[NodeId] = frozenset(),
    include_one_of: frozenset[NodeId] | None = None,
    budget: int,
) -> list[dict[int, Found]]:
    """The best cycle *met* per length for every goal, from one budgeted depth-first search
    shared by all lengths and goals (the heuristic placement uses beyond 8 nodes).

    Returns one dict per goal: length -> ``Found`` (the smallest ``cycle_key`` among the
    cycles met of that length in ``goal.sizes``, weighing at least ``goal.min_weight``,
    containing ``required`` and one of ``include_one_of`` when given, that ``goal.accept``
    takes). Single nodes are all checked. Longer cycles: starts in weight order (each
    cycle is met from its rank-0 node), each start may spend half the budget left (at least
    ``len(nodes)``); paths extend best link first, then heavier node, only through nodes
    that can still reach the start, and every node on the path with an edge back to the
    start closes a cycle of the path's length. ``budget`` caps the successors examined in
    total (the first full-length path of an n-node mesh examines about n*n/2).

    What it gives up against ``branch_and_bound`` (exact per length): a cycle is only found if the
    search meets it within the budget. On a full mesh of equal links, with no required
    node, the first path from the heaviest node is the heaviest node set in rank order, so
    every length gets its best cycle (when ``accept`` takes it); with mixed links, required
    nodes or sparse edges a worse cycle may be returned, or none for a length that has one.
    Cost: O(budget + edges per start tried), whatever the number of lengths and goals.
    """
    if any(n not in graph.index for n in required):
        return [{} for _ in goals]
    req_mask = sum(1 << graph.index[n] for n in required)
    host_mask = -1 if include_one_of is None else sum(1 << graph.index[n] for n in include_one_of if n in graph.index)
    state = _Sweep(graph, goals, req_mask, host_mask)
    state.run(budget)
    return state.results


class _Sweep:
    """One ``sweep`` call: the records per goal and length, and the depth-first extension."""

    def __init__(self, graph: CycleSearch, goals: list[Goal], req_mask: int, host_mask: int) -> None:
        self.graph = graph
        self.goals = goals
        self.req_mask = req_mask
        self.host_mask = host_mask
        self.longest = max((max(g.sizes) for g in goals if g.sizes), default=0)
        self.results: list[dict[int, Found]] = [{} for _ in goals]
        # Per goal and length: (key head, path) of the best so far. Comparing index paths is
        # comparing the key's rank-order tuples: indices follow (-weight, id).
        self.met: list[dict[int, tuple[tuple[int, int, int, int], list[int]]]] = [{} for _ in goals]
        self.start = -1
        self.path: list[int] = []
        self.reach: list[int] = []
        self.spent = 0
        self.allowance = 0

    def run(self, budget: int) -> None:
        """Check every single node, then extend paths from each start in weight order while
        the budget lasts (each start may spend half of what is left, at least one per node)."""
        graph, w = self.graph, self.graph.w
        count = len(graph.order)
        for i in range(count):
            self.offer([i], 1 << i, w[i], graph.single_rank, 0)
        left = budget
        req_mask, host_mask = self.req_mask, self.host_mask
        for s in range(count):
            if self.longest < 2 or left <= 0 or req_mask & ((1 << s) - 1) or (host_mask != -1 and host_mask >> s == 0):
                break
            self.allowance = min(left, max(left // 2, count))
            self.reach = graph.distances(s)
            self.start, self.path, self.spent = s, [s], 0
            self.extend(1 << s, w[s], graph.max_rank, 0)
            left -= self.spent

    def offer(self, path: list[int], mask: int, weight: int, worst: int, total: int) -> None:
        """Record the index cycle ``path`` (nodes ``mask``, ``weight`` bytes, worst link rank
        ``worst``, sum of link ranks ``total``) for every goal it fits and improves."""
        if self.req_mask & ~mask or (self.host_mask != -1 and not self.host_mask & mask):
            return
        order, w = self.graph.order, self.graph.w
        length = len(path)
        for goal, found, seen in zip(self.goals, self.results, self.met, strict=True):
            if length not in goal.sizes or weight < goal.min_weight:
                continue
            model = goal.cost(length) if goal.cost is not None and goal.rank_links else None
            price = self.graph.path_cost(path, model)
            mark = ((price, -worst, -total, -weight) if goal.rank_links else (0, 0, 0, -weight), path)
            if length in seen and mark >= seen[length]:
                continue
            cycle = tuple(order[i] for i in path)
            payload = goal.accept(cycle)
            if payload is not None:
                seen[length] = (mark[0], path[:])
                found[length] = Found((*mark[0], tuple((-w[i], order[i]) for i in path)), cycle, payload)

    def extend(self, mask: int, weight: int, worst: int, total: int) -> None:
        """Extend the current path depth first, best link first, closing a cycle at every node
        with an edge back to the start, until the start's allowance is spent."""
        graph, path, s = self.graph, self.path, self.start
        count = len(graph.order)
        last = path[-1]
        for j, rank in graph.succ[last]:
            if self.spent >= self.allowance:
                return
            self.spent += 1
            if j <= s or mask >> j & 1 or self.reach[j] > count:
                continue
            path.append(j)
            jw, jmin, jsum, jmask = weight + graph.w[j], min(worst, rank), total + rank, mask | 1 << j
            closing = graph.rank_of[j].get(s)
            if closing is not None:
                self.offer(path, jmask, jw, min(jmin, closing), jsum + closing)
            if len(path) < self.longest:
                self.extend(jmask, jw, jmin, jsum)
            path.pop()
