"""The topology graph and the cycle search placement uses (design.md §3 "topology", "cycle").

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

import ipaddress
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from exo_p2p.types import NodeId, State

T = TypeVar("T")

LINK_RANK: Mapping[str, int] = {"thunderbolt": 3, "ethernet": 2, "wifi": 1, "loopback": 0, "other": 0}
"""How good a link is, by the edge's ``interface_type``: Thunderbolt > Ethernet > Wi-Fi > the
rest (loopback, unknown). Higher is better."""

BEST_LINK_RANK = max(LINK_RANK.values())

CycleKey = tuple[int, int, int, tuple[str, ...], tuple[str, ...]]
"""Sort key of a cycle (smaller is better): ``(-worst link rank, -sum of link ranks, -sum of
node weights, sorted node ids, node ids in rank order)``. See ``cycle_key``."""


@dataclass(frozen=True, slots=True)
class Link:
    """A usable edge: the ``ip`` the source dials to reach the sink, and its ``rank``
    (``LINK_RANK`` of the edge's interface type)."""

    ip: str
    rank: int


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


def topology_from_state(state: State, among: Iterable[NodeId] | None = None) -> Topology:
    """The graph of ``state.edges`` restricted to ``among`` (default: every node in
    ``state.nodes``); self-edges and edges to nodes outside the set are dropped."""
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
                links[source][sink] = Link(ip, LINK_RANK.get(edge.interface_type, 0))
    return Topology(tuple(sorted(keep)), links, tuple(sorted(unaddressed)))


def rank_order(cycle: Iterable[NodeId], weights: Mapping[NodeId, int]) -> tuple[NodeId, ...]:
    """``cycle`` rotated to start at its member with the largest weight (ties: the smallest
    node id) — rank 0 — with the cycle's direction kept."""
    nodes = tuple(cycle)
    start = min(range(len(nodes)), key=lambda i: (-weights[nodes[i]], nodes[i]))
    return nodes[start:] + nodes[:start]


def cycle_key(
    topology: Topology, cycle: tuple[NodeId, ...], weights: Mapping[NodeId, int], *, rank_links: bool = True
) -> CycleKey:
    """The choice-order key of ``cycle`` (a cycle of ``topology`` in rank order); smaller is better.

    In order: the worst link of the cycle (higher rank first), the sum of its link ranks, the
    sum of ``weights`` (more first), the sorted node ids (lexicographically smaller first), the
    node ids in rank order (smaller first). A single node has no link: worst = the best rank,
    sum 0. With ``rank_links=False`` both link components are 0 (memory only).
    """
    worst, total = BEST_LINK_RANK, 0
    if rank_links and len(cycle) > 1:
        ranks = [topology.links[cycle[i - 1]][cycle[i]].rank for i in range(len(cycle))]
        worst, total = min(ranks), sum(ranks)
    if not rank_links:
        worst = 0
    return (-worst, -total, -sum(weights[n] for n in cycle), tuple(sorted(cycle)), tuple(cycle))


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
) -> SearchOutcome[T]:
    """The best cycle of exactly ``size`` nodes by ``cycle_key`` that ``accept`` takes.

    Candidates: simple cycles of ``topology`` over the nodes that have a weight in ``weights``
    (bytes), whose weights sum to at least ``min_weight``, that contain every node of
    ``required`` and, when ``include_one_of`` is given, at least one of those nodes. ``accept``
    gets each candidate (rank order: starting at the heaviest member, ties smallest id) that
    beats the best so far and returns a payload, or None to reject it. Only cycles with a key
    smaller than ``better_than`` are considered, when it is given.

    Method: each cycle is visited once, from its rank-0 node (nodes in the order weight desc,
    id asc; a path from start s only uses later nodes). Paths are extended best link first and
    cut when an optimistic key (worst link so far, all remaining links best, heaviest remaining
    nodes, smallest remaining ids, the path as rank-order prefix) cannot beat the best cycle
    accepted, when the weight cannot reach ``min_weight``, when required nodes cannot all fit,
    or when the path's end is too far from its start to close the cycle in time. ``budget``
    caps the path extensions (None: exact).
    """
    order = sorted((n for n in topology.nodes if n in weights), key=lambda n: (-weights[n], n))
    count = len(order)
    if size < 1 or size > count:
        return SearchOutcome(None, False, 0)
    index = {node: i for i, node in enumerate(order)}
    w = [weights[n] for n in order]
    best_rank = BEST_LINK_RANK if rank_links else 0
    succ: list[list[tuple[int, int]]] = []
    rank_of: list[dict[int, int]] = []
    for node in order:
        outs = [(index[t], link.rank if rank_links else 0) for t, link in topology.links.get(node, {}).items() if t in index]
        outs.sort(key=lambda item: (-item[1], item[0]))
        succ.append(outs)
        rank_of.append(dict(outs))
    preds: list[list[int]] = [[] for _ in range(count)]
    for i, outs in enumerate(succ):
        for j, _ in outs:
            preds[j].append(i)
    by_id = sorted(range(count), key=lambda i: order[i])
    req_mask = sum(1 << index[n] for n in required if n in index)
    if len(required) != bin(req_mask).count("1"):
        return SearchOutcome(None, False, 0)
    host_mask = sum(1 << index[n] for n in include_one_of if n in index) if include_one_of is not None else -1
    if host_mask == 0:
        return SearchOutcome(None, False, 0)

    best: list[Found[T] | None] = [None]
    limit: list[CycleKey | None] = [better_than]
    spent = [0]

    def offer(cycle_idx: list[int], key: CycleKey) -> None:
        bound = limit[0]
        if bound is not None and key >= bound:
            return
        cycle = tuple(order[i] for i in cycle_idx)
        payload = accept(cycle)
        if payload is not None:
            best[0] = Found(key, cycle, payload)
            limit[0] = key

    if size == 1:
        for i in range(count):
            if w[i] < min_weight:
                break
            if req_mask & ~(1 << i) or (host_mask != -1 and not host_mask >> i & 1):
                continue
            offer([i], (-best_rank, 0, -w[i], (order[i],), (order[i],)))
        return SearchOutcome(best[0], False, 0)

    exhausted = False
    for s in range(count):
        if sum(w[s : s + size]) < min_weight or len(w) - s < size:
            break  # weights are sorted: later starts only get lighter
        if req_mask & ((1 << s) - 1):
            break  # a required node lies before s: no later start can include it
        if host_mask != -1 and host_mask >> s == 0:
            break
        dist = _distances_to(s, preds, count)
        try:
            _extend(s, size, succ, rank_of, w, order, by_id, dist, req_mask, host_mask, min_weight, best_rank, limit, offer, spent, budget)
        except _BudgetSpent:
            exhausted = True
            break
    return SearchOutcome(best[0], exhausted, spent[0])


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


def _extend(
    s: int,
    size: int,
    succ: list[list[tuple[int, int]]],
    rank_of: list[dict[int, int]],
    w: list[int],
    order: list[NodeId],
    by_id: list[int],
    dist: list[int],
    req_mask: int,
    host_mask: int,
    min_weight: int,
    best_rank: int,
    limit: list[CycleKey | None],
    offer: Callable[[list[int], CycleKey], None],
    spent: list[int],
    budget: int | None,
) -> None:
    """Depth-first branch and bound over paths from ``s`` (see ``best_cycle``)."""
    count = len(order)
    path = [s]

    def optimistic(mask: int, cur_w: int, cur_min: int, cur_sum: int, remaining: int) -> tuple[int, int, int] | None:
        # heaviest `remaining` nodes after s not on the path (w is sorted desc)
        extra, taken, i = 0, 0, s + 1
        while taken < remaining and i < count:
            if not mask >> i & 1:
                extra += w[i]
                taken += 1
            i += 1
        if taken < remaining or cur_w + extra < min_weight:
            return None
        return (-cur_min, -(cur_sum + (remaining + 1) * best_rank), -(cur_w + extra))

    def beaten(lb3: tuple[int, int, int], mask: int, remaining: int) -> bool:
        bound = limit[0]
        if bound is None:
            return False
        head = bound[:3]
        if lb3 != head:
            return lb3 > head
        ids = [order[i] for i in path]
        taken = 0
        for i in by_id:
            if taken == remaining:
                break
            if i > s and not mask >> i & 1:
                ids.append(order[i])
                taken += 1
        return (tuple(sorted(ids)), tuple(order[i] for i in path)) > bound[3:]

    def go(mask: int, cur_w: int, cur_min: int, cur_sum: int) -> None:
        last = path[-1]
        remaining = size - len(path)
        if remaining == 0:
            closing = rank_of[last].get(s)
            if closing is None or (host_mask != -1 and not host_mask & mask):
                return
            ids = [order[i] for i in path]
            key = (-min(cur_min, closing), -(cur_sum + closing), -cur_w, tuple(sorted(ids)), tuple(ids))
            offer(path, key)
            return
        for j, rank in succ[last]:
            if j <= s or mask >> j & 1 or dist[j] > remaining:
                continue
            spent[0] += 1
            if budget is not None and spent[0] > budget:
                raise _BudgetSpent
            new_mask = mask | 1 << j
            left = remaining - 1
            missing = req_mask & ~new_mask
            if missing and bin(missing).count("1") > left:
                continue
            if host_mask != -1 and not host_mask & new_mask and (left == 0 or not host_mask & ~new_mask >> (s + 1) << (s + 1)):
                continue
            new_min = min(cur_min, rank)
            lb3 = optimistic(new_mask, cur_w + w[j], new_min, cur_sum + rank, left)
            if lb3 is None:
                continue
            path.append(j)
            if not beaten(lb3, new_mask, left):
                go(new_mask, cur_w + w[j], new_min, cur_sum + rank)
            path.pop()

    start_lb = optimistic(1 << s, w[s], best_rank, 0, size - 1)
    if start_lb is None or beaten(start_lb, 1 << s, size - 1):
        return
    go(1 << s, w[s], best_rank, 0)
