"""The exact search for the best cycle of one size: depth-first branch and bound.

``best_cycle`` (or ``branch_and_bound`` on a prepared ``CycleSearch``) finds the best simple
cycle of an exact size under the choice order of placement (``master.placement.cycle_order``)
without listing every simple cycle of a dense graph. It is exact when it is given no
``budget``; with a budget it stops after that many path extensions and returns the best cycle
found so far, flagged ``exhausted``.

Method: each cycle is visited once, from its rank-0 node (nodes ordered weight desc, id asc;
a path from start s only uses later nodes). Paths are extended best link first and cut when
an optimistic key (the path's cost so far with every remaining hop as cheap as the cheapest
hop of the graph, ``master.placement.cost.lower_bound_us``; worst link so far; every remaining
link as good as the best link of the graph; the heaviest remaining nodes, including the
required ones and a host when one is needed; the path as a rank-order prefix) cannot beat the
best cycle accepted, when the weight cannot reach ``min_weight``, when the required nodes
cannot all fit, or when the path's end is too far from its start to close the cycle in time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from exo_p2p.types import NodeId
from master.placement.completion_bound import CompletionBound, completion_bound
from master.placement.cost import CostModel, lower_bound_us
from master.placement.cycle_order import CycleKey
from master.placement.cycle_search import CycleSearch, Found, SearchOutcome
from master.placement.topology import Topology

T = TypeVar("T")


def best_cycle(
    topology: Topology,
    *,
    size: int,
    weights: Mapping[NodeId, int],
    accept: Callable[[tuple[NodeId, ...]], T | None],
    min_weight: int = 0,
    required: frozenset[NodeId] = frozenset(),
    include_one_of: frozenset[NodeId] | None = None,
    rank_links: bool = True,
    budget: int | None = None,
    better_than: CycleKey | None = None,
    node_floor: int = 0,
    cost: CostModel | None = None,
) -> SearchOutcome[T]:
    """The best cycle of exactly ``size`` nodes by ``cycle_key`` (with ``cost``) that ``accept`` takes.

    Candidates: simple cycles of ``topology`` over the nodes that have a weight in ``weights``
    (bytes), whose weights sum to at least ``min_weight``, that contain every node of
    ``required`` and, when ``include_one_of`` is given, at least one of those nodes. ``accept``
    gets each candidate (rank order: starting at the heaviest member, ties smallest id) that
    beats the best so far and returns a payload, or None to reject it. Only cycles with a key
    smaller than ``better_than`` are considered, when it is given. Nodes lighter than
    ``node_floor`` are not used. ``budget`` caps the path extensions (None: exact). Method:
    module docstring; the graph is prepared by ``CycleSearch`` (``rank_links``: there).
    """
    search = CycleSearch(topology, weights, rank_links=rank_links)
    return branch_and_bound(
        search, size, accept, min_weight=min_weight, required=required, include_one_of=include_one_of,
        budget=budget, better_than=better_than, node_floor=node_floor, cost=cost,
    )


def branch_and_bound(
    graph: CycleSearch,
    size: int,
    accept: Callable[[tuple[NodeId, ...]], T | None],
    *,
    min_weight: int = 0,
    required: frozenset[NodeId] = frozenset(),
    include_one_of: frozenset[NodeId] | None = None,
    budget: int | None = None,
    better_than: CycleKey | None = None,
    node_floor: int = 0,
    cost: CostModel | None = None,
) -> SearchOutcome[T]:
    """``best_cycle`` on the prepared ``graph`` (its topology, weights and ``rank_links``); the
    other arguments as there. ``cost`` is ignored when the graph ignores link quality."""
    order, w = graph.order, graph.w
    count = sum(1 for x in w if x >= node_floor)  # lighter nodes (a suffix) are not used
    if size < 1 or size > count or any(n not in graph.index or graph.index[n] >= count for n in required):
        return SearchOutcome(None, False, 0)
    req_mask = sum(1 << graph.index[n] for n in required)
    host_mask = -1
    if include_one_of is not None:
        host_mask = sum(1 << graph.index[n] for n in include_one_of if n in graph.index)
        if host_mask == 0:
            return SearchOutcome(None, False, 0)
    state = _BranchAndBound(graph, size, count, accept, min_weight, req_mask, host_mask, budget, better_than,
                            cost if graph.rank_links else None)
    if size == 1:
        for i in range(count):
            if w[i] < min_weight:
                break
            if req_mask & ~(1 << i) or (host_mask != -1 and not host_mask >> i & 1):
                continue
            state.offer([i], (0, -graph.single_rank, 0, -w[i], ((-w[i], order[i]),)))
        return SearchOutcome(state.best, False, 0)
    exhausted = False
    for s in range(count):
        if count - s < size or sum(w[s : s + size]) < min_weight:
            break  # weights are sorted: later starts only get lighter
        if req_mask & ((1 << s) - 1):
            break  # a required node lies before s: no later start can include it
        if host_mask != -1 and host_mask >> s == 0:
            break
        try:
            state.run(s)
        except _BudgetSpent:
            exhausted = True
            break
    return SearchOutcome(state.best, exhausted, state.spent)


class _BudgetSpent(Exception):
    """The search's budget of path extensions ran out (caught in ``branch_and_bound``)."""


class _BranchAndBound(Generic[T]):
    """One ``branch_and_bound`` call: the best cycle so far and the depth-first extension."""

    def __init__(
        self,
        graph: CycleSearch,
        size: int,
        count: int,
        accept: Callable[[tuple[NodeId, ...]], T | None],
        min_weight: int,
        req_mask: int,
        host_mask: int,
        budget: int | None,
        better_than: CycleKey | None,
        model: CostModel | None = None,
    ) -> None:
        self.graph = graph
        self.model = model
        self.fwd, self.close, self.cheapest = graph.costs(model) if model is not None else ([], [], 0)
        self.size = size
        self.count = count
        self.accept = accept
        self.min_weight = min_weight
        self.req_mask = req_mask
        self.host_mask = host_mask
        self.budget = budget
        self.limit = better_than
        self.req_list = [i for i in range(count) if req_mask >> i & 1]
        self.best: Found[T] | None = None
        self.spent = 0
        self.start = -1
        self.path: list[int] = []
        self.dist: list[int] = []

    def offer(self, cycle_idx: list[int], key: CycleKey) -> None:
        """Take the index cycle ``cycle_idx`` (rank order) as the best so far when its ``key``
        beats the limit and ``accept`` returns a payload for it."""
        if self.limit is not None and key >= self.limit:
            return
        cycle = tuple(self.graph.order[i] for i in cycle_idx)
        payload = self.accept(cycle)
        if payload is not None:
            self.best = Found(key, cycle, payload)
            self.limit = key

    def run(self, start: int) -> None:
        """Every cycle whose rank-0 node is ``start``."""
        graph, size = self.graph, self.size
        head_w = sum(graph.w[start : start + size])
        price = lower_bound_us(self.model, 0, size, self.cheapest) if self.model is not None and size > 1 else 0
        head_bound = (price, -graph.single_rank if size == 1 else -graph.max_rank, -size * graph.max_rank, -head_w)
        self.start = start
        self.path = [start]
        if self._beaten(head_bound):
            return
        self.dist = graph.distances(start)
        self._go(1 << start, graph.w[start], graph.max_rank, 0, 0)

    def _combine(self, partial: int, hop: int) -> int:
        """The hops' costs so far with one more (sum or max, ``CostModel.combine``)."""
        if self.model is None:
            return 0
        return partial + hop if self.model.combine == "sum" else max(partial, hop)

    def _beaten(self, head_bound: tuple[int, int, int, int]) -> bool:
        """True when no completion of the current path (optimistic head ``head_bound``) can beat the
        best so far: the rank-order tuple of any completion starts with the path's."""
        bound = self.limit
        if bound is None:
            return False
        head = bound[:4]
        if head_bound != head:
            return head_bound > head
        w, order = self.graph.w, self.graph.order
        return tuple((-w[i], order[i]) for i in self.path) > bound[4]

    def _close(self, mask: int, cur_w: int, cur_min: int, cur_sum: int, cur_cost: int) -> None:
        """Offer the full-length path as a cycle when its last node links back to start (and it
        holds a host when one is needed)."""
        graph, start, path, w = self.graph, self.start, self.path, self.graph.w
        last = path[-1]
        closing = graph.rank_of[last].get(start)
        if closing is None or (self.host_mask != -1 and not self.host_mask & mask):
            return
        seq = tuple((-w[i], graph.order[i]) for i in path)
        price = 0 if self.model is None else self.model.factor * self._combine(cur_cost, self.close[last][start])
        key = (price, -min(cur_min, closing), -(cur_sum + closing), -cur_w, seq)
        self.offer(path, key)

    def _cut(self, j: int, head_bound: tuple[int, int, int, int]) -> bool:
        """True when no completion through child ``j`` (optimistic head ``head_bound``) can beat
        the best so far."""
        if self.limit is None or head_bound < self.limit[:4]:
            return False
        if head_bound > self.limit[:4]:
            return True
        self.path.append(j)
        beaten = self._beaten(head_bound)
        self.path.pop()
        return beaten

    def _go(self, mask: int, cur_w: int, cur_min: int, cur_sum: int, cur_cost: int) -> None:
        """Extend the current path (nodes ``mask``, weight ``cur_w``, worst link ``cur_min``, sum of
        link ranks ``cur_sum``, hop costs ``cur_cost``) depth first by every child that may
        still lead to a better cycle. Raises ``_BudgetSpent`` when the budget runs out."""
        graph, start, path, w = self.graph, self.start, self.path, self.graph.w
        last = path[-1]
        remaining = self.size - len(path)
        if remaining == 0:
            self._close(mask, cur_w, cur_min, cur_sum, cur_cost)
            return
        left = remaining - 1
        forced_mask = self.req_mask & ~mask
        need_host = self.host_mask != -1 and not self.host_mask & (mask | forced_mask)
        completion: CompletionBound | None = None  # once per path, when its first child passes the cheap checks
        max_rank = graph.max_rank
        for j, rank in graph.succ[last]:
            if j <= start or j >= self.count or mask >> j & 1 or self.dist[j] > remaining:
                continue
            self.spent += 1
            if self.budget is not None and self.spent > self.budget:
                raise _BudgetSpent
            if completion is None:
                completion = completion_bound(graph.w, start, self.count, mask, self.req_list, forced_mask,
                                              self.host_mask, left, need_host)
            extra = completion.extra_weight(j)
            if extra is None or cur_w + extra < self.min_weight:
                continue
            ub_w = cur_w + extra
            new_min = min(cur_min, rank)
            new_cost = self._combine(cur_cost, self.fwd[last][j]) if self.model is not None else 0
            price = lower_bound_us(self.model, new_cost, left + 1, self.cheapest) if self.model is not None else 0
            head_bound = (price, -new_min, -(cur_sum + rank + (left + 1) * max_rank), -ub_w)
            if self._cut(j, head_bound):
                continue
            path.append(j)
            self._go(mask | 1 << j, cur_w + w[j], new_min, cur_sum + rank, new_cost)
            path.pop()
