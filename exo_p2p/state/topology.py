"""The topology graph and the cycle search placement uses (docs/architecture.md#vocabulary "topology", "cycle").

A ``Topology`` is the directed reachability graph of State restricted to some nodes: an edge
A→B exists when State holds ``edges[A][B]`` with an address at which B can be dialled (an IP,
or a multiaddr / ``ip:port`` holding one). Edges without such an address are kept aside in
``unaddressed`` so errors can name the pair.

``best_cycle`` finds the best simple cycle of an exact size under the choice order of
placement (see ``cycle_key``) by depth-first branch and bound; it never lists every simple
cycle of a dense graph. It is exact when it is given no ``budget``; with a budget (placement
passes one beyond 8 nodes) it stops after that many path extensions and returns the best cycle
found so far, flagged ``exhausted``.
"""

from __future__ import annotations

import functools
import ipaddress
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from exo_p2p.links.cost import (
    CostModel,
    Path,
    assumed_path,
    best_path,
    hop_cost_us,
    lower_bound_us,
    measured_path,
    ring_cost_us,
)
from exo_p2p.types import NodeId, State

T = TypeVar("T")

LINK_RANK: Mapping[str, int] = {"thunderbolt": 3, "ethernet": 2, "wifi": 1, "loopback": 0, "other": 0}
"""How good a link is, by the edge's ``interface_type``: Thunderbolt > Ethernet > Wi-Fi > the
rest (loopback, unknown). Higher is better."""

BEST_LINK_RANK = max(LINK_RANK.values())

CycleKey = tuple[int, int, int, int, tuple[tuple[int, str], ...]]
"""Sort key of a cycle (smaller is better): ``(network cost per token in µs, -worst link rank,
-sum of link ranks, -sum of node weights, ((-weight, id) of each node in rank order))``. See
``cycle_key``."""


@dataclass(frozen=True, slots=True)
class Link:
    """A usable edge: the ``ip`` the source dials to reach the sink (the edge's address), its
    ``rank`` (``LINK_RANK`` of the edge's interface type) and every address of the sink it may
    use, with figures (``paths``: measured ones from ``State.links``, else the edge's address
    with the figures assumed for its type; ``exo_p2p.links.cost``)."""

    ip: str
    rank: int
    paths: tuple[Path, ...] = ()

    def best(self, nbytes: int) -> Path:
        """The cheapest address for ``nbytes`` per token (``exo_p2p.links.cost.best_path``)."""
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


def rank_order(cycle: Iterable[NodeId], weights: Mapping[NodeId, int]) -> tuple[NodeId, ...]:
    """``cycle`` rotated to start at its member with the largest weight (ties: the smallest
    node id) — rank 0 — with the cycle's direction kept."""
    nodes = tuple(cycle)
    start = min(range(len(nodes)), key=lambda i: (-weights[nodes[i]], nodes[i]))
    return nodes[start:] + nodes[:start]


def ring_cost(topology: Topology, cycle: tuple[NodeId, ...], model: CostModel | None) -> int:
    """The network cost per token (µs) of ``cycle`` (rank order) under ``model``, each hop over
    its cheapest address (``exo_p2p.links.cost``); 0 without a model or for one node."""
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


class _BudgetSpent(Exception):
    pass


class CycleSearch:
    """Branch-and-bound search for the best cycle of a given size, prepared once for one
    ``topology`` and one set of node ``weights`` (bytes; nodes without a weight are not used)
    and reused for every size and request. ``rank_links=False`` ignores link quality (the key's
    link components are 0: memory, then ids). The network cost (the key's first component) is
    given per search as a ``CostModel`` (None: 0 for every cycle); its hop costs are computed
    once per model and cached.

    Method: each cycle is visited once, from its rank-0 node (nodes ordered weight desc, id asc;
    a path from start s only uses later nodes). Paths are extended best link first and cut when
    an optimistic key (the path's cost so far with every remaining hop as cheap as the cheapest
    hop of the graph, ``exo_p2p.links.cost.lower_bound_us``; worst link so far; every remaining
    link as good as the best link of the graph; the heaviest remaining nodes, including the required ones and a host when one is
    needed; the path as a rank-order prefix) cannot beat the best cycle accepted, when the weight cannot reach ``min_weight``,
    when the required nodes cannot all fit, or when the path's end is too far from its start
    to close the cycle in time.
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

    def best(
        self,
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
        """See ``best_cycle``."""
        order, w = self.order, self.w
        count = sum(1 for x in w if x >= node_floor)  # lighter nodes (a suffix) are not used
        if size < 1 or size > count or any(n not in self.index or self.index[n] >= count for n in required):
            return SearchOutcome(None, False, 0)
        req_mask = sum(1 << self.index[n] for n in required)
        host_mask = -1
        if include_one_of is not None:
            host_mask = sum(1 << self.index[n] for n in include_one_of if n in self.index)
            if host_mask == 0:
                return SearchOutcome(None, False, 0)
        state = _Search(self, size, count, accept, min_weight, req_mask, host_mask, budget, better_than,
                        cost if self.rank_links else None)
        if size == 1:
            for i in range(count):
                if w[i] < min_weight:
                    break
                if req_mask & ~(1 << i) or (host_mask != -1 and not host_mask >> i & 1):
                    continue
                state.offer([i], (0, -self.single_rank, 0, -w[i], ((-w[i], order[i]),)))
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


    def _distances(self, start: int) -> list[int]:
        """``_distances_to(start)``, cached per start."""
        if start not in self._dist:
            self._dist[start] = _distances_to(start, self.preds, len(self.order))
        return self._dist[start]

    def sweep(
        self,
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

        What it gives up against ``best`` (exact per length): a cycle is only found if the
        search meets it within the budget. On a full mesh of equal links, with no required
        node, the first path from the heaviest node is the heaviest node set in rank order, so
        every length gets its best cycle (when ``accept`` takes it); with mixed links, required
        nodes or sparse edges a worse cycle may be returned, or none for a length that has one.
        Cost: O(budget + edges per start tried), whatever the number of lengths and goals.
        """
        order, w, succ, rank_of = self.order, self.w, self.succ, self.rank_of
        count = len(order)
        results: list[dict[int, Found]] = [{} for _ in goals]
        if any(n not in self.index for n in required):
            return results
        req_mask = sum(1 << self.index[n] for n in required)
        host_mask = -1 if include_one_of is None else sum(1 << self.index[n] for n in include_one_of if n in self.index)
        longest = max((max(g.sizes) for g in goals if g.sizes), default=0)

        # Per goal and length: (key head, path) of the best so far. Comparing index paths is
        # comparing the key's rank-order tuples: indices follow (-weight, id).
        met: list[dict[int, tuple[tuple[int, int, int, int], list[int]]]] = [{} for _ in goals]

        def offer(path: list[int], mask: int, weight: int, worst: int, total: int) -> None:
            if req_mask & ~mask or (host_mask != -1 and not host_mask & mask):
                return
            length = len(path)
            for goal, found, seen in zip(goals, results, met, strict=True):
                if length not in goal.sizes or weight < goal.min_weight:
                    continue
                model = goal.cost(length) if goal.cost is not None and goal.rank_links else None
                price = self.path_cost(path, model)
                mark = ((price, -worst, -total, -weight) if goal.rank_links else (0, 0, 0, -weight), path)
                if length in seen and mark >= seen[length]:
                    continue
                cycle = tuple(order[i] for i in path)
                payload = goal.accept(cycle)
                if payload is not None:
                    seen[length] = (mark[0], path[:])
                    found[length] = Found((*mark[0], tuple((-w[i], order[i]) for i in path)), cycle, payload)

        for i in range(count):
            offer([i], 1 << i, w[i], self.single_rank, 0)
        left = budget
        for s in range(count):
            if longest < 2 or left <= 0 or req_mask & ((1 << s) - 1) or (host_mask != -1 and host_mask >> s == 0):
                break
            allowance = min(left, max(left // 2, count))
            reach = self._distances(s)
            path = [s]
            spent = 0

            def extend(mask: int, weight: int, worst: int, total: int) -> None:
                nonlocal spent
                last = path[-1]
                for j, rank in succ[last]:
                    if spent >= allowance:
                        return
                    spent += 1
                    if j <= s or mask >> j & 1 or reach[j] > count:
                        continue
                    path.append(j)
                    jw, jmin, jsum, jmask = weight + w[j], min(worst, rank), total + rank, mask | 1 << j
                    closing = rank_of[j].get(s)
                    if closing is not None:
                        offer(path, jmask, jw, min(jmin, closing), jsum + closing)
                    if len(path) < longest:
                        extend(jmask, jw, jmin, jsum)
                    path.pop()

            extend(1 << s, w[s], self.max_rank, 0)
            left -= spent
        return results


@dataclass(frozen=True)
class Goal(Generic[T]):
    """What ``CycleSearch.sweep`` records: per length in ``sizes``, the best cycle weighing at
    least ``min_weight`` bytes that ``accept`` takes (returns a payload, or None to reject).
    ``rank_links=False`` ranks by memory only (the key's link components are 0); ``cost`` gives the
network cost model per length."""

    accept: Callable[[tuple[NodeId, ...]], T | None]
    sizes: frozenset[int]
    min_weight: int = 0
    rank_links: bool = True
    cost: Callable[[int], CostModel | None] | None = None
    """Per cycle length, the network cost model of the key's first component (None: 0)."""


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
    ``CycleSearch``.
    """
    search = CycleSearch(topology, weights, rank_links=rank_links)
    return search.best(
        size, accept, min_weight=min_weight, required=required, include_one_of=include_one_of,
        budget=budget, better_than=better_than, node_floor=node_floor, cost=cost,
    )


class _Search(Generic[T]):
    """One ``CycleSearch.best`` call: the best cycle so far and the depth-first extension."""

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
        self.dist = graph._distances(start)
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

    def _heaviest_free(self, taken: int, n: int, need_host: bool) -> tuple[list[int], int | None]:
        """The heaviest ``n`` nodes after start not in ``taken`` (weight order; all of them when
        fewer), extended to the first host when ``need_host``; and that host's position."""
        free: list[int] = []
        first_host = None
        host_mask = self.host_mask
        i = self.start + 1
        while i < self.count and (len(free) < n or (need_host and first_host is None)):
            if not taken >> i & 1:
                if need_host and first_host is None and host_mask >> i & 1:
                    first_host = len(free)
                free.append(i)
            i += 1
        return free, first_host

    def _go(self, mask: int, cur_w: int, cur_min: int, cur_sum: int, cur_cost: int) -> None:  # noqa: PLR0912
        graph, start, path, w = self.graph, self.start, self.path, self.graph.w
        last = path[-1]
        remaining = self.size - len(path)
        if remaining == 0:
            closing = graph.rank_of[last].get(start)
            if closing is None or (self.host_mask != -1 and not self.host_mask & mask):
                return
            seq = tuple((-w[i], graph.order[i]) for i in path)
            price = 0 if self.model is None else self.model.factor * self._combine(cur_cost, self.close[last][start])
            key = (price, -min(cur_min, closing), -(cur_sum + closing), -cur_w, seq)
            self.offer(path, key)
            return
        left = remaining - 1
        # Optimistic weight of a completion through child j: the path, j, the required nodes
        # still missing ("forced"), and the heaviest other nodes after start ("free", weight
        # order) for the slots left — with a host among them when one is still needed.
        # Computed once per path, when its first child passes the cheap checks.
        forced_mask = self.req_mask & ~mask
        host_mask = self.host_mask
        need_host = host_mask != -1 and not host_mask & (mask | forced_mask)
        prepared = False
        max_rank = graph.max_rank
        for j, rank in graph.succ[last]:
            if j <= start or j >= self.count or mask >> j & 1 or self.dist[j] > remaining:
                continue
            self.spent += 1
            if self.budget is not None and self.spent > self.budget:
                raise _BudgetSpent
            if not prepared:
                prepared = True
                forced = [i for i in self.req_list if i > start and forced_mask >> i & 1]
                forced_w = sum(w[i] for i in forced)
                free, first_host = self._heaviest_free(mask | forced_mask, left - len(forced) + 2, need_host)
                prefix = [0]
                for i in free:
                    prefix.append(prefix[-1] + w[i])
                pos = {i: p for p, i in enumerate(free)}
            j_forced = forced_mask >> j & 1
            slots = left - (len(forced) - j_forced)  # free slots after j
            j_free_pos = None if j_forced else pos.get(j)
            if slots < 0 or len(free) - (j_free_pos is not None) < slots:
                continue
            if j_free_pos is not None and j_free_pos < slots:
                end, window = slots + 1, prefix[slots + 1] - w[j]
            else:
                end, window = slots, prefix[slots]
            if need_host and not host_mask >> j & 1:
                if first_host is None or slots == 0:
                    continue
                if first_host >= end:
                    window += w[free[first_host]] - w[free[end - 1]]
            ub_w = cur_w + forced_w + window + (0 if j_forced else w[j])
            if ub_w < self.min_weight:
                continue
            new_min = min(cur_min, rank)
            new_cost = self._combine(cur_cost, self.fwd[last][j]) if self.model is not None else 0
            price = lower_bound_us(self.model, new_cost, left + 1, self.cheapest) if self.model is not None else 0
            head_bound = (price, -new_min, -(cur_sum + rank + (left + 1) * max_rank), -ub_w)
            if self.limit is not None and head_bound >= self.limit[:4]:
                if head_bound > self.limit[:4]:
                    continue
                path.append(j)
                beaten = self._beaten(head_bound)
                path.pop()
                if beaten:
                    continue
            path.append(j)
            self._go(mask | 1 << j, cur_w + w[j], new_min, cur_sum + rank, new_cost)
            path.pop()


def _distances_to(start: int, preds: list[list[int]], count: int) -> list[int]:
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
