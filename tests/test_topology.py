"""Topology graph and the branch-and-bound cycle search, against a brute force over all cycles."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from master.placement.cost import CostModel, measured_path
from master.placement.branch_and_bound import best_cycle, branch_and_bound
from master.placement.completion_bound import completion_bound, heaviest_free
from master.placement.cycle_order import cycle_key, rank_order
from master.placement.cycle_search import CycleSearch
from master.placement.cycle_sweep import Goal, sweep
from master.placement.topology import LINK_RANK, Link, Topology, ring_ip, topology_from_state
from exo_p2p.types import NodeProfile, State, TopologyEdge


def test_ring_ip_forms() -> None:
    assert ring_ip("192.0.2.10") == "192.0.2.10"
    assert ring_ip("192.0.2.10:52514") == "192.0.2.10"
    assert ring_ip("/ip4/203.0.113.1/tcp/52514") == "203.0.113.1"
    assert ring_ip("/ip6/::1/tcp/1") == "::1"
    assert ring_ip("[fe80::1]:7") == "fe80::1"
    assert ring_ip("fe80::2") == "fe80::2"
    for bad in ("", "host.local", "/dns4/x/tcp/1", "1.2.3"):
        assert ring_ip(bad) is None


def _state(edges: list[tuple[str, str, str, str]], nodes: tuple[str, ...] = ("a", "b", "c")) -> State:
    profiles = {n: NodeProfile(n, "boot", n, 1, 1) for n in nodes}  # type: ignore[arg-type]
    table: dict = {}
    for a, b, address, kind in edges:
        table.setdefault(a, {})[b] = TopologyEdge(a, b, address, kind)  # type: ignore[arg-type]
    return State(nodes=profiles, edges=table)


def test_topology_from_state_keeps_addressed_edges_among_nodes() -> None:
    state = _state([("a", "b", "10.0.0.2", "thunderbolt"), ("b", "a", "", "ethernet"), ("a", "x", "10.0.0.9", "wifi"), ("c", "c", "10.0.0.3", "other")])
    topo = topology_from_state(state)
    assert topo.nodes == ("a", "b", "c")
    assert topo.link("a", "b") is not None and topo.link("a", "b").ip == "10.0.0.2"  # type: ignore[union-attr]
    assert topo.link("a", "b").rank == LINK_RANK["thunderbolt"]  # type: ignore[union-attr]
    assert topo.link("b", "a") is None and topo.unaddressed == (("b", "a"),)
    assert topo.link("c", "c") is None and topo.link("a", "x") is None
    assert topology_from_state(state, among=["a"]).links == {"a": {}}


def test_rank_order_starts_at_heaviest_then_smallest_id() -> None:
    assert rank_order(("a", "b", "c"), {"a": 1, "b": 5, "c": 5}) == ("b", "c", "a")
    assert rank_order(("c", "a", "b"), {"a": 5, "b": 5, "c": 1}) == ("a", "b", "c")


def test_heaviest_free_takes_the_heaviest_untaken_then_reaches_a_host() -> None:
    assert heaviest_free(0, 5, 0b00101, 2, -1, False) == ([1, 3], None)
    assert heaviest_free(0, 5, 0b00101, 2, 1 << 4, True) == ([1, 3, 4], 2)
    assert heaviest_free(3, 5, 0, 9, -1, False) == ([4], None)


def test_completion_bound_is_the_heaviest_completion_through_each_child() -> None:
    """Weights by index (heaviest first); a path [0] with one slot after its next node."""
    w = [8, 4, 2, 1, 1]
    free = completion_bound(w, 0, 5, 0b1, [], 0, -1, 1, False)
    assert free.extra_weight(1) == 4 + 2 and free.extra_weight(3) == 1 + 4
    host = completion_bound(w, 0, 5, 0b1, [], 0, 1 << 4, 1, True)
    assert host.extra_weight(1) == 4 + 1 and host.extra_weight(4) == 1 + 4
    forced = completion_bound(w, 0, 5, 0b1, [2], 1 << 2, -1, 1, False)
    assert forced.extra_weight(1) == 4 + 2 and forced.extra_weight(2) == 2 + 4
    assert completion_bound(w, 0, 5, 0b1, [2, 3], 0b1100, -1, 0, False).extra_weight(1) is None


@st.composite
def graphs(draw: st.DrawFn) -> tuple[Topology, dict[str, int]]:
    n = draw(st.integers(1, 8))
    nodes = tuple(f"n{i}" for i in range(n))
    links: dict = {v: {} for v in nodes}
    for a in nodes:
        for b in nodes:
            if a != b and draw(st.booleans()):
                paths = tuple(
                    measured_path(f"10.{k}.0.{b[1:]}", "other", draw(st.integers(0, 5000)), draw(st.integers(10**4, 10**9)))
                    for k in range(draw(st.integers(0, 2)))
                )
                links[a][b] = Link(f"10.0.0.{b[1:]}", draw(st.sampled_from([0, 1, 2, 3])), paths)
    weights = {v: draw(st.sampled_from([1, 2, 4, 8])) for v in nodes if draw(st.integers(0, 9)) > 0}
    return Topology(nodes, links), weights


def _brute(topo: Topology, weights: dict[str, int], size: int, min_weight: int, required: frozenset[str], hosts: frozenset[str] | None, accept, cost=None) -> tuple | None:  # type: ignore[no-untyped-def]
    best = None
    for combo in itertools.permutations(sorted(weights), size):
        if combo != rank_order(combo, weights) or not topo.is_cycle(combo):
            continue
        if not required <= set(combo) or (hosts is not None and not hosts & set(combo)):
            continue
        if sum(weights[n] for n in combo) < min_weight or not accept(combo):
            continue
        key = cycle_key(topo, combo, weights, cost=cost)
        if best is None or key < best[0]:
            best = (key, combo)
    return best


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.integers(1, 7), st.integers(0, 30), st.data())
def test_search_equals_brute_force(graph: tuple[Topology, dict[str, int]], size: int, min_weight: int, data: st.DataObject) -> None:
    topo, weights = graph
    pool = sorted(weights)
    required = frozenset(data.draw(st.lists(st.sampled_from(pool), max_size=2))) if pool else frozenset()
    hosts = frozenset(data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=2))) if pool and data.draw(st.booleans()) else None
    salt = data.draw(st.integers(0, 3))

    def accept(cycle: tuple[str, ...]) -> bool:  # rejects some cycles, deterministically
        return salt == 0 or hash(cycle) % 4 != salt % 4

    cost = data.draw(st.sampled_from([None, CostModel(256, 4, "sum", 1), CostModel(64, 64, "max", 12)]))
    outcome = best_cycle(topo, size=size, weights=weights, accept=lambda c: True if accept(c) else None, min_weight=min_weight, required=required, include_one_of=hosts, cost=cost)
    expected = _brute(topo, weights, size, min_weight, required, hosts, accept, cost)
    assert not outcome.exhausted
    if expected is None:
        assert outcome.best is None
    else:
        assert outcome.best is not None
        assert (outcome.best.key, outcome.best.cycle) == expected


def test_budget_stops_the_search_and_says_so() -> None:
    n = 12
    nodes = tuple(f"n{i:02d}" for i in range(n))
    # a one-way ring: the only cycle of n nodes; no 5-cycle exists, so the search must explore
    links = {v: {nodes[(i + 1) % n]: Link("10.0.0.1", 2), nodes[(i + 2) % n]: Link("10.0.0.1", 2)} for i, v in enumerate(nodes)}
    search = CycleSearch(Topology(nodes, links), {v: 1 for v in nodes})
    exact = branch_and_bound(search, 11, lambda c: True)
    capped = branch_and_bound(search, 11, lambda c: True, budget=3)
    assert not exact.exhausted and exact.best is not None and exact.expansions > 3
    assert capped.exhausted and capped.expansions == 4


def test_dense_graph_search_is_not_exhaustive() -> None:
    """On a 40-node full mesh of equal machines the best 20-node cycle is found with a number
    of path extensions linear in the graph, not the (19!)-many cycles."""
    nodes = tuple(f"n{i:02d}" for i in range(40))
    links = {a: {b: Link("10.0.0.1", 2) for b in nodes if b != a} for a in nodes}
    outcome = branch_and_bound(CycleSearch(Topology(nodes, links), {v: 64 for v in nodes}), 20, lambda c: True)
    assert outcome.best is not None and outcome.best.cycle == nodes[:20]
    assert outcome.expansions < 40 * 40


def _exact_per_length(search: CycleSearch, sizes: range, **kw) -> dict[int, tuple]:
    found = {}
    for k in sizes:
        best = branch_and_bound(search, k, lambda c: True, **kw).best
        if best is not None:
            found[k] = (best.key, best.cycle)
    return found


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12), st.data())
def test_sweep_on_an_equal_link_mesh_is_exact_for_every_length(n: int, data: st.DataObject) -> None:
    """The documented case where the heuristic gives up nothing: a full mesh of equal links."""
    nodes = tuple(f"n{i:02d}" for i in range(n))
    links = {a: {b: Link("10.0.0.1", 2) for b in nodes if b != a} for a in nodes}
    weights = {v: data.draw(st.sampled_from([1, 2, 4, 8])) for v in nodes}
    search = CycleSearch(Topology(nodes, links), weights)
    sizes = range(1, n + 1)
    swept = sweep(search, [Goal(lambda c: True, frozenset(sizes))], budget=n * n)[0]
    assert {k: (f.key, f.cycle) for k, f in swept.items()} == _exact_per_length(search, sizes)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.integers(0, 30), st.integers(1, 60), st.data())
def test_sweep_records_are_candidates_and_never_beat_the_exact_search(graph, min_weight: int, budget: int, data: st.DataObject) -> None:
    topo, weights = graph
    pool = sorted(weights)
    required = frozenset(data.draw(st.lists(st.sampled_from(pool), max_size=2))) if pool else frozenset()
    hosts = frozenset(data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=2))) if pool and data.draw(st.booleans()) else None
    search = CycleSearch(topo, weights)
    sizes = range(1, len(topo.nodes) + 1)
    goals = [Goal(lambda c: c, frozenset(sizes), min_weight), Goal(lambda c: c, frozenset(sizes), rank_links=False)]
    by_key, by_memory = sweep(search, goals, required=required, include_one_of=hosts, budget=budget)
    exact = _exact_per_length(search, sizes, min_weight=min_weight, required=required, include_one_of=hosts)
    for k, found in by_key.items():
        cycle = found.cycle
        assert len(cycle) == k and topo.is_cycle(cycle) and cycle == rank_order(cycle, weights)
        assert required <= set(cycle) and (hosts is None or hosts & set(cycle))
        assert sum(weights[v] for v in cycle) >= min_weight and found.payload == cycle
        assert found.key == cycle_key(topo, cycle, weights) and found.key >= exact[k][0]
    for k, found in by_memory.items():
        assert topo.is_cycle(found.cycle) and found.key == cycle_key(topo, found.cycle, weights, rank_links=False)
    assert set(by_key) <= set(exact)
