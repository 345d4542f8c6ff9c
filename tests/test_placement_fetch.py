"""Placement on nodes that lack the model but may fetch it from peers (docs/models.md, ``master.placement.fetch``)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p.types import HubSource
from exo_p2p.types.manifest import HeldModel
from master.placement.place import PlacementError, place_instance, placement_previews
from master.placement.fetch import disk_needed, fetch_split, shard_fetch_bytes
from tests.support.rules.placement_cluster import GIB, card, cluster


def _only_n0_holds(state, *, disk: dict[str, int | None], digest: str = "d1", complete: bool = True):
    """``n0`` holds model ``m`` (manifest ``digest``); the others do not, with ``disk`` free bytes."""
    nodes = {}
    for node, profile in state.nodes.items():
        if node == "n0":
            nodes[node] = msgspec.structs.replace(profile, held_models=(HeldModel("m", digest, complete),),
                                                  models_disk_free=100 * GIB)
        else:
            nodes[node] = msgspec.structs.replace(profile, models=(), models_disk_free=disk.get(node))
    return msgspec.structs.replace(state, nodes=nodes)


def test_node_without_the_model_takes_a_rank_and_the_preview_shows_what_it_fetches() -> None:
    # each node 6 GiB, the model 8 GiB: only a 2-node pipeline fits; n1 lacks the model
    state = _only_n0_holds(cluster([(6 * GIB, 6 * GIB)] * 2), disk={"n1": 50 * GIB})
    model = card(8, 8 * GIB, emb=GIB // 4)
    inst = place_instance(state, model)
    assert {s.node_id for s in inst.shards} == {"n0", "n1"}
    assert inst.model_digest == "d1"
    preview = next(p for p in placement_previews(state, model) if p.sharding == "pipeline" and p.world_size == 2)
    assert preview.error is None
    fetch = dict(zip(preview.nodes, preview.fetch_bytes_per_node))
    assert fetch["n0"] == 0
    shard = next(s for s in preview.instance.shards if s.node_id == "n1")
    expected = sum(model.layer_bytes[shard.start_layer:shard.end_layer]) + (
        model.embedding_bytes if shard.rank == 0 else model.head_bytes)
    assert fetch["n1"] == expected > 0


def test_no_complete_copy_anywhere_means_no_fetcher() -> None:
    state = _only_n0_holds(cluster([(6 * GIB, 6 * GIB)] * 2), disk={"n1": 50 * GIB}, complete=False)
    with pytest.raises(PlacementError, match="no node publishes a complete copy"):
        place_instance(state, card(8, 8 * GIB), min_nodes=2)


def test_node_that_does_not_report_its_disk_is_not_a_candidate() -> None:
    state = _only_n0_holds(cluster([(6 * GIB, 6 * GIB)] * 2), disk={"n1": None})
    with pytest.raises(PlacementError, match="does not report its free disk"):
        place_instance(state, card(8, 8 * GIB), min_nodes=2)


def test_fetcher_without_disk_for_its_shard_is_refused_with_the_numbers() -> None:
    # n1 would fetch ~4 GiB but has 1 GiB free
    state = _only_n0_holds(cluster([(6 * GIB, 6 * GIB)] * 2), disk={"n1": GIB})
    with pytest.raises(PlacementError, match=r"would fetch .* needs \d+ bytes free in its models dir but has 1073741824 bytes"):
        place_instance(state, card(8, 8 * GIB), min_nodes=2)


def test_a_fetcher_short_of_disk_is_passed_over_for_one_that_has_it() -> None:
    # three equal nodes; n1 has no disk to spare, n2 has: the 2-node pipeline is n0 + n2
    state = _only_n0_holds(cluster([(6 * GIB, 6 * GIB)] * 3), disk={"n1": GIB, "n2": 50 * GIB})
    inst = place_instance(state, card(8, 8 * GIB), min_nodes=2)
    assert {s.node_id for s in inst.shards} == {"n0", "n2"}


def test_holders_fetch_nothing_and_a_single_fetching_rank_fetches_the_whole_model() -> None:
    state = _only_n0_holds(cluster([(2 * GIB, 2 * GIB), (20 * GIB, 20 * GIB)]), disk={"n1": 50 * GIB})
    model = card(4, 8 * GIB)
    inst = place_instance(state, model)  # only n1 has the memory
    assert [s.node_id for s in inst.shards] == ["n1"]
    preview = next(p for p in placement_previews(state, model) if p.sharding == "pipeline" and p.world_size == 1)
    assert preview.fetch_bytes_per_node == (model.storage_size,)


@settings(max_examples=60, deadline=None)
@given(
    layers=st.lists(st.integers(1, 10**6), min_size=2, max_size=12),
    emb=st.integers(0, 10**6),
    tied=st.booleans(),
    cuts=st.data(),
)
def test_pipeline_fetch_bytes_of_all_ranks_sum_to_the_model(layers, emb, tied, cuts) -> None:
    """Every stored byte is fetched by exactly one rank, except a tied embedding, which the
    first and the last rank both load (property of ``shard_fetch_bytes``)."""
    n = len(layers)
    model = card(n, 0, emb=emb, tied=tied, layer_bytes=tuple(layers))
    world = cuts.draw(st.integers(2, n))
    bounds = sorted(cuts.draw(st.lists(st.integers(1, n - 1), min_size=world - 1, max_size=world - 1, unique=True)))
    edges = [0, *bounds, n]
    total = sum(shard_fetch_bytes(model, "pipeline", r, world, edges[r], edges[r + 1]) for r in range(world))
    assert total == model.storage_size + (model.embedding_bytes if tied else 0)
    assert shard_fetch_bytes(model, "tensor", 0, world, 0, n) == model.storage_size


@given(st.integers(0, 10**15))
def test_disk_headroom_is_ten_percent_rounded_up(fetch) -> None:
    need = disk_needed(fetch)
    assert need * 10 >= fetch * 11 > (need - 1) * 10


def test_a_node_with_a_complete_fetched_copy_fetches_nothing() -> None:
    state = _only_n0_holds(cluster([(6 * GIB, 6 * GIB)] * 2), disk={"n1": 0})
    n1 = msgspec.structs.replace(state.nodes["n1"], held_models=(HeldModel("m", "d1", True),))
    state = msgspec.structs.replace(state, nodes={**state.nodes, "n1": n1})
    preview = next(p for p in placement_previews(state, card(8, 8 * GIB)) if p.sharding == "pipeline" and p.world_size == 2)
    assert preview.error is None and preview.fetch_bytes_per_node == (0, 0)  # no disk needed either


def _hub_only(n: int):
    """``n`` nodes lacking model ``m``, which a hub source names (no node holds it)."""
    state = _only_n0_holds(cluster([(6 * GIB, 6 * GIB)] * n), disk={f"n{i}": 50 * GIB for i in range(n)})
    nodes = {k: msgspec.structs.replace(v, models=(), held_models=(), models_disk_free=50 * GIB)
             for k, v in state.nodes.items()}
    return msgspec.structs.replace(state, nodes=nodes, hub_models={"m": HubSource("org/m", "c" * 40, "d1")})


def test_previews_of_a_hub_model_say_what_each_node_takes_from_peers_and_from_the_hub() -> None:
    state = _hub_only(2)
    model = card(8, 8 * GIB, emb=GIB // 4, tied=True)
    preview = next(p for p in placement_previews(state, model) if p.sharding == "pipeline" and p.world_size == 2)
    assert preview.error is None
    split = fetch_split(state, model, preview.sharding, preview.nodes, preview.fetch_bytes_per_node)
    # rank 0 takes its layers and the embedding from the hub; the last rank the tied head from rank 0's node
    assert split[0] == (0, preview.fetch_bytes_per_node[0])
    assert split[1] == (model.embedding_bytes, preview.fetch_bytes_per_node[1] - model.embedding_bytes)
    small = card(4, 2 * GIB, emb=GIB // 8, tied=True)
    single = next(p for p in placement_previews(_hub_only(1), small))
    assert fetch_split(_hub_only(1), small, single.sharding, single.nodes,
                       single.fetch_bytes_per_node) == [(0, small.storage_size)]
    held = _only_n0_holds(cluster([(6 * GIB, 6 * GIB)] * 2), disk={"n1": 50 * GIB})
    held = msgspec.structs.replace(held, hub_models=state.hub_models)  # a complete copy: all from peers
    assert fetch_split(held, model, "pipeline", ("n0", "n1"), (0, GIB)) == [(0, 0), (GIB, 0)]


@settings(max_examples=60, deadline=None)
@given(fetch=st.lists(st.integers(0, 10**9), min_size=1, max_size=6), emb=st.integers(0, 10**9),
       tied=st.booleans(), sharding=st.sampled_from(["pipeline", "tensor"]), same_node=st.booleans())
def test_a_fetch_split_adds_up_and_the_hub_sends_each_byte_once(fetch, emb, tied, sharding, same_node) -> None:
    """Each rank's (peers, hub) sums to its fetch; a pipeline's hub bytes leave out the tied
    head only when rank 0's node (another node) fetches the embedding first."""
    state = _hub_only(2)
    model = card(4, 4 * GIB, emb=emb, tied=tied)
    nodes = tuple("n0" if same_node else f"n{i}" for i in range(len(fetch)))
    split = fetch_split(state, model, sharding, nodes, fetch)
    assert [a + b for a, b in split] == fetch and all(a >= 0 and b >= 0 for a, b in split)
    shared = sum(a for a, _ in split)
    last = len(fetch) - 1
    expected = (min(fetch[last], emb) if sharding == "pipeline" and last > 0 and tied and fetch[0] > 0
                and not same_node else 0)
    assert shared == expected
