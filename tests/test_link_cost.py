"""The network cost of a ring (docs/links.md, ``master.placement.cost``) and placement by it
(``master.placement.place``): exact values, the ring over the fastest address, the closing hop over
the slow pair, and hypothesis properties (a faster link never makes the chosen cost worse;
adding a link never hurts)."""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from master.placement.cost import ASSUMED, cost_model, hidden_bytes, hop_cost_us, measured_path, ring_cost_us
from exo_p2p.types import LinkFigures, ModelCard, NodeProfile, State, TopologyEdge
from master.placement.place import place_instance, placement_previews

GIB = 1 << 30


def card(n_layers: int = 8, hidden: int = 64, *, heads: int = 8, kv: int = 4, layer: int = GIB // 8) -> ModelCard:
    return ModelCard(
        model_id="m", n_layers=n_layers, hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv,
        vocab_size=100, context_length=2048, storage_size=layer * n_layers, layer_bytes=(layer,) * n_layers,
        embedding_bytes=0, head_bytes=0, norm_bytes=0, tie_word_embeddings=False,
    )  # type: ignore[arg-type]


def cluster(n: int, memory: int = 4 * GIB, pairs=None) -> State:  # type: ignore[no-untyped-def]
    ids = [f"n{i}" for i in range(n)]
    nodes = {v: NodeProfile(v, "b", v, memory, memory, models=("m",)) for v in ids}  # type: ignore[arg-type]
    edges: dict = {}
    for i, a in enumerate(ids):
        for j, b in enumerate(ids):
            if a != b and (pairs is None or (a, b) in pairs):
                edges.setdefault(a, {})[b] = TopologyEdge(a, b, f"10.0.{i}.{j}")  # type: ignore[arg-type]
    return State(nodes=nodes, edges=edges)  # type: ignore[arg-type]


def with_links(state: State, figures: dict[tuple[str, str], list[LinkFigures]]) -> State:
    links: dict = {}
    for (a, b), figs in figures.items():
        for f in figs:
            links.setdefault(a, {}).setdefault(b, {})[f.address] = f
    return msgspec.structs.replace(state, links=links)


def test_hop_and_ring_costs_in_microseconds() -> None:
    fast = measured_path("10.0.0.2", "other", 300, 100_000_000)
    assert hop_cost_us(fast, 2048) == 300 + 21  # 2048 B at 100 MB/s = 20.48 µs, rounded up
    assert hidden_bytes(card(hidden=576)) == 576 * 4
    pipe = cost_model(card(hidden=576), "pipeline", 2)
    assert (pipe.hop_bytes, pipe.close_bytes, pipe.combine, pipe.factor) == (2304, 4, "sum", 1)
    assert ring_cost_us(pipe, [100, 200], 50) == 350 and ring_cost_us(pipe, [], None) == 0
    tensor = cost_model(card(n_layers=30, hidden=576), "tensor", 3)
    assert (tensor.hop_bytes, tensor.combine, tensor.factor) == (576 * 4 // 3, "max", 30 * 2 * 2 * 2)
    assert ring_cost_us(tensor, [10, 70], 20) == 240 * 70
    assert measured_path("x", "wifi", 500, None).bytes_per_s == ASSUMED["wifi"][1]  # bandwidth not measured yet


def test_two_addresses_the_ring_uses_the_fast_one_and_the_preview_shows_its_cost() -> None:
    base = cluster(2, memory=GIB // 2 + GIB // 4)  # the model needs both nodes
    slow = [LinkFigures("10.0.0.1", 20_000, 1_000_000), LinkFigures("10.7.0.1", 300, 100_000_000)]
    back = [LinkFigures("10.0.1.0", 20_000, 1_000_000), LinkFigures("10.7.1.0", 300, 100_000_000)]
    state = with_links(base, {("n0", "n1"): slow, ("n1", "n0"): back})
    inst = place_instance(state, card(), min_nodes=2)
    assert [s.ring_address.rsplit(":", 1)[0] for s in inst.shards] == ["10.7.1.0", "10.7.0.1"]
    preview = next(p for p in placement_previews(state, card()) if p.sharding == "pipeline" and p.world_size == 2)
    assert preview.links_measured and preview.network_us_per_token == (300 + 3) + (300 + 1)
    # the fast address is lost: the slow one is used, and the preview says what it costs
    state = with_links(base, {("n0", "n1"): slow[:1], ("n1", "n0"): back[:1]})
    inst = place_instance(state, card(), min_nodes=2)
    assert [s.ring_address.rsplit(":", 1)[0] for s in inst.shards] == ["10.0.1.0", "10.0.0.1"]
    preview = next(p for p in placement_previews(state, card()) if p.sharding == "pipeline" and p.world_size == 2)
    assert preview.network_us_per_token == (20_000 + 256) + (20_000 + 4)


def test_three_nodes_the_slow_pair_carries_only_the_token() -> None:
    """Rank 0 is n0 (the most memory); the slow pair n0–n2 becomes the closing hop, so the
    hidden states never cross it: n0 → n1 → n2 → n0."""
    state = cluster(3, memory=GIB // 2 - GIB // 16)
    state = msgspec.structs.replace(state, nodes={**state.nodes, "n0": msgspec.structs.replace(state.nodes["n0"], memory_total=GIB, memory_available=GIB)})
    fast, slow = (300, 100_000_000), (20_000, 100_000)
    figures = {}
    for a, b in [("n0", "n1"), ("n1", "n0"), ("n1", "n2"), ("n2", "n1"), ("n0", "n2"), ("n2", "n0")]:
        rtt, bw = slow if {a, b} == {"n0", "n2"} else fast
        figures[(a, b)] = [LinkFigures(state.edges[a][b].address, rtt, bw)]
    state = with_links(state, figures)
    inst = place_instance(state, card(), min_nodes=3)
    assert [s.node_id for s in inst.shards] == ["n0", "n1", "n2"]
    # and with the slow pair n1–n2, which every 3-ring crosses forward, a 2-node ring avoids it
    figures = {k: [LinkFigures(state.edges[k[0]][k[1]].address, *(slow if set(k) == {"n1", "n2"} else fast))] for k in figures}
    two = next(p for p in placement_previews(with_links(cluster(3), figures), card()) if p.sharding == "pipeline" and p.world_size == 2)
    assert set(two.nodes) != {"n1", "n2"}


@st.composite
def measured_clusters(draw):  # type: ignore[no-untyped-def]
    n = draw(st.integers(2, 5))
    ids = [f"n{i}" for i in range(n)]
    nodes = {v: NodeProfile(v, "b", v, m := draw(st.sampled_from([GIB // 4, GIB // 2, GIB])), m, models=("m",)) for v in ids}  # type: ignore[arg-type]
    edges: dict = {}
    links: dict = {}
    for i, a in enumerate(ids):
        for j, b in enumerate(ids):
            if a == b or not draw(st.booleans()):
                continue
            edges.setdefault(a, {})[b] = TopologyEdge(a, b, f"10.0.{i}.{j}", draw(st.sampled_from(["other", "ethernet", "wifi"])))  # type: ignore[arg-type]
            for k in range(draw(st.integers(0, 2))):
                address = f"10.{k}.{i}.{j}"
                links.setdefault(a, {}).setdefault(b, {})[address] = LinkFigures(address, draw(st.integers(50, 50_000)), draw(st.integers(10**5, 10**10)))
    model = card(n_layers=draw(st.integers(2, 8)), hidden=draw(st.sampled_from([8, 64, 4096])), heads=8, kv=4)
    return State(nodes=nodes, edges=edges, links=links), model  # type: ignore[arg-type]


def costs(state: State, model: ModelCard) -> dict[tuple[str, int], int]:
    return {(p.sharding, p.world_size): p.network_us_per_token for p in placement_previews(state, model) if p.error is None}


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(measured_clusters(), st.data())
def test_a_faster_link_never_makes_the_chosen_cost_worse(case, data: st.DataObject) -> None:  # type: ignore[no-untyped-def]
    state, model = case
    measured = [(a, b, addr) for a, sinks in state.links.items() for b, figs in sinks.items() for addr in figs]
    if not measured:
        return
    a, b, addr = data.draw(st.sampled_from(measured))
    old = state.links[a][b][addr]
    faster = LinkFigures(addr, data.draw(st.integers(0, old.rtt_us)), data.draw(st.integers(old.bytes_per_s or 1, 2 * 10**10)))
    better = msgspec.structs.replace(state, links={**state.links, a: {**state.links[a], b: {**state.links[a][b], addr: faster}}})
    before, after = costs(state, model), costs(better, model)
    assert before.keys() == after.keys()
    assert all(after[k] <= before[k] for k in before)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(measured_clusters(), st.data())
def test_adding_a_link_never_hurts(case, data: st.DataObject) -> None:  # type: ignore[no-untyped-def]
    state, model = case
    ids = sorted(state.nodes)
    a, b = data.draw(st.permutations(ids))[:2]
    figures = LinkFigures("10.9.9.9", data.draw(st.integers(50, 50_000)), data.draw(st.integers(10**5, 10**10)))
    # a new link: an edge where there was none, or another address of a measured pair (an
    # address measured where nothing was replaces assumed figures: that is news, not a link)
    assume(b not in state.edges.get(a, {}) or bool(state.links.get(a, {}).get(b)))
    edges = dict(state.edges)
    if b not in edges.get(a, {}):
        edges[a] = {**edges.get(a, {}), b: TopologyEdge(a, b, "10.9.9.9")}  # type: ignore[arg-type]
    links = {**state.links, a: {**state.links.get(a, {}), b: {**state.links.get(a, {}).get(b, {}), "10.9.9.9": figures}}}
    before, after = costs(state, model), costs(msgspec.structs.replace(state, edges=edges, links=links), model)
    assert before.keys() <= after.keys()
    assert all(after[k] <= before[k] for k in before)


def test_an_unmeasured_edge_address_beside_measured_ones_is_not_used() -> None:
    """The connection's address lost its figures (LinkLost) while the edge still names it:
    the ring goes over the measured slow address, never the dead one."""
    base = cluster(2, memory=GIB // 2 + GIB // 4)
    state = with_links(base, {("n0", "n1"): [LinkFigures("10.7.0.1", 20_000, 1_000_000)],
                              ("n1", "n0"): [LinkFigures("10.7.1.0", 20_000, 1_000_000)]})
    inst = place_instance(state, card(), min_nodes=2)
    assert [s.ring_address.rsplit(":", 1)[0] for s in inst.shards] == ["10.7.1.0", "10.7.0.1"]
