"""Which weights each rank holds (float32 on CPU nodes): pure rules of ``master.placement.split`` and
``master.placement.place``, the card's float32 sizes, and memory admission of float32 ranks.

A node's ``cpu_weights`` (its profile): ``auto`` holds float32 when the rank's float32 share
fits its usable memory with 10% headroom, else the stored weights; ``float32`` / ``stored``
force it. The shard records the choice and ``share_bytes`` in those bytes.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p.types import ModelCard, NodeProfile, ShardMetadata, State, TopologyEdge
from master.admission import kv_bytes_per_token
from master.placement.place import PlacementError, place_instance, placement_previews
from master.placement.split import Overflow, headroom_bytes, pipeline_shares, tensor_shares

MIB = 1 << 20


def q_card(n_layers: int = 8, layer: int = 10 * MIB, emb: int = 8 * MIB, expand: int = 6) -> ModelCard:
    """A quantized card whose float32 layers are ``expand``× the stored ones (the embedded
    4-bit model: 6.4×) and tied embedding 3.5× (its 8-bit embedding)."""
    return ModelCard(
        model_id="m", n_layers=n_layers, hidden_size=64, num_attention_heads=8, num_key_value_heads=4,
        vocab_size=100, context_length=2048, storage_size=n_layers * layer + emb + 1024,
        layer_bytes=(layer,) * n_layers, embedding_bytes=emb, head_bytes=0, norm_bytes=1024,
        tie_word_embeddings=True, activation_dtype_bytes=2,
        float32_layer_bytes=(layer * expand,) * n_layers, float32_embedding_bytes=emb * 7 // 2,
        float32_head_bytes=0, float32_norm_bytes=1024,
    )


def state(nodes: list[tuple[int, str]], model: str = "m") -> State:
    """Nodes n0.. with (memory_total = available, cpu_weights), full mesh."""
    ids = [f"n{i}" for i in range(len(nodes))]
    profiles = {nid: NodeProfile(nid, f"boot-{nid}", nid, mem, mem, models=(model,), backend="cpu", cpu_weights=w)
                for nid, (mem, w) in zip(ids, nodes)}
    edges = {a: {b: TopologyEdge(a, b, f"10.0.{i}.{j}", "ethernet") for j, b in enumerate(ids) if a != b}
             for i, a in enumerate(ids)}
    return State(nodes=profiles, edges=edges)  # type: ignore[arg-type]


def test_sized_for_float32_sums_the_float32_parts() -> None:
    card = q_card()
    f32 = card.sized_for("float32")
    assert f32.layer_bytes == card.float32_layer_bytes and f32.embedding_bytes == card.float32_embedding_bytes
    assert f32.storage_size == sum(f32.layer_bytes) + f32.non_layer_bytes
    assert card.sized_for("stored") is card
    with pytest.raises(ValueError):
        msgspec.structs.replace(card, float32_layer_bytes=()).sized_for("float32")


def test_auto_node_that_fits_only_stored_gets_stored_and_a_roomy_one_float32() -> None:
    card = q_card()
    f32 = card.sized_for("float32").storage_size
    small = state([(headroom_bytes(f32) - 1, "auto")])  # stored fits, float32 + 10% does not
    (shard,) = place_instance(small, card).shards
    assert (shard.weights_dtype, shard.share_bytes) == ("stored", card.storage_size)
    roomy = state([(headroom_bytes(f32), "auto")])
    (shard,) = place_instance(roomy, card).shards
    assert (shard.weights_dtype, shard.share_bytes) == ("float32", f32)


def test_stored_setting_and_old_profiles_never_expand() -> None:
    card = q_card()
    big = 100 * card.sized_for("float32").storage_size
    assert place_instance(state([(big, "stored")]), card).shards[0].weights_dtype == "stored"
    old = state([(big, "auto")])
    old = msgspec.structs.replace(old, nodes={n: msgspec.structs.replace(p, cpu_weights="stored") for n, p in old.nodes.items()})
    assert place_instance(old, card).shards[0].weights_dtype == "stored"
    # a card without float32 sizes (from before them) is never expanded
    flat = msgspec.structs.replace(card, float32_layer_bytes=())
    assert place_instance(state([(big, "float32")]), flat).shards[0].weights_dtype == "stored"


def test_forced_float32_that_does_not_fit_is_refused_with_the_float32_bytes() -> None:
    card = q_card()
    f32 = card.sized_for("float32").storage_size
    with pytest.raises(PlacementError, match=str(f32)):
        place_instance(state([(f32 - 1, "float32")]), card)


def test_pipeline_ranks_may_differ_and_each_share_is_in_its_own_bytes() -> None:
    card = q_card()
    f32 = card.sized_for("float32")
    # n0 roomy (float32), n1 small (stored only): two ranks, split by capacity
    st_ = state([(2 * f32.storage_size, "auto"), (card.storage_size // 2, "auto")])
    inst = place_instance(st_, card, min_nodes=2)
    dtypes = {s.node_id: s.weights_dtype for s in inst.shards}
    assert dtypes == {"n0": "float32", "n1": "stored"}
    for s in inst.shards:
        c = card.sized_for(s.weights_dtype)
        first, last = s.rank == 0, s.rank == s.world_size - 1
        extra = (c.embedding_bytes if first else 0) + (c.embedding_bytes + c.norm_bytes if last else 0)
        assert s.share_bytes == extra + sum(c.layer_bytes[s.start_layer:s.end_layer])
        assert s.share_bytes <= st_.nodes[s.node_id].memory_total
    previews = [p for p in placement_previews(st_, card) if p.sharding == "pipeline" and p.world_size == 2]
    assert previews[0].weights_per_node == tuple(s.weights_dtype for s in inst.shards)
    assert previews[0].bytes_per_node == tuple(s.share_bytes for s in inst.shards)


@settings(max_examples=200, deadline=None)
@given(mems=st.lists(st.integers(1 * MIB, 2000 * MIB), min_size=1, max_size=4),
       policies=st.lists(st.sampled_from(["auto", "float32", "stored"]), min_size=4, max_size=4))
def test_pipeline_shares_fit_and_auto_float32_ranks_have_headroom(mems: list[int], policies: list[str]) -> None:
    card = q_card()
    pol = policies[: len(mems)]
    shares = pipeline_shares(card, mems, pol)
    if isinstance(shares, Overflow):
        return
    assert [s.start_layer for s in shares][0] == 0 and shares[-1].end_layer == card.n_layers
    for r, s in enumerate(shares):
        assert s.share_bytes <= mems[r]
        if pol[r] == "stored":
            assert s.weights_dtype == "stored"
        if pol[r] == "float32":
            assert s.weights_dtype == "float32"
        if pol[r] == "auto" and s.weights_dtype == "float32":
            assert headroom_bytes(s.share_bytes) <= mems[r]
    # all stored: exactly the split from before float32 ranks existed
    if all(p == "stored" for p in pol):
        assert shares == pipeline_shares(card, mems)


def test_tensor_ranks_decide_each_on_its_own_memory() -> None:
    card = q_card()
    f32_share = tensor_shares(card.sized_for("float32"), [10**12, 10**12])[0].share_bytes
    shares = tensor_shares(card, [headroom_bytes(f32_share), headroom_bytes(f32_share) - 1], ["auto", "auto"])
    assert not isinstance(shares, Overflow)
    assert [s.weights_dtype for s in shares] == ["float32", "stored"]
    assert shares[0].share_bytes == f32_share and shares[1].share_bytes < f32_share


def test_admission_counts_a_float32_rank_kv_in_four_bytes() -> None:
    card = q_card()
    stored = ShardMetadata("n0", "r0", 0, 1, 0, 8, 8, 1, "b")  # type: ignore[arg-type]
    f32 = msgspec.structs.replace(stored, weights_dtype="float32")
    assert kv_bytes_per_token(card, f32) == 2 * kv_bytes_per_token(card, stored)


def test_card_float32_sizes_match_what_the_float32_load_holds(tmp_path) -> None:
    """The card's float32 bytes of a 4-bit model (8-bit embedding, per-module override) equal
    the bytes of the parameters ``load_model(weights_dtype="float32")`` holds."""
    from mlx.utils import tree_flatten

    from exo_p2p.models.card.derive import card_from_model_dir
    from tests.support.models.synthetic_models import make_synthetic_model
    from worker.engine.loading.loader import load_all

    model_dir = make_synthetic_model(tmp_path / "q", n_layers=3, hidden_size=64, intermediate_size=128,
                                     quantize=True, dtype="float16")
    card = card_from_model_dir(model_dir, "q")
    assert card.expandable and card.sized_for("float32").storage_size > 4 * card.storage_size
    loaded = load_all(model_dir, weights_dtype="float32")
    params = tree_flatten(loaded.model.parameters())
    assert all(str(p.dtype) == "mlx.core.float32" for _, p in params)
    assert sum(p.nbytes for _, p in params) == card.sized_for("float32").storage_size


def test_cpu_weights_setting_and_what_the_profile_publishes() -> None:
    from exo_p2p.cli.errors import CliError
    from exo_p2p.cli.cluster.node_config import build_node_config
    from worker.profile import compute_backend, published_cpu_weights

    assert build_node_config().cpu_weights == "auto"
    assert build_node_config(cpu_weights="stored").cpu_weights == "stored"
    with pytest.raises(CliError) as e:
        build_node_config(cpu_weights="fp32")
    assert e.value.exit_code == 2 and "auto, float32, stored" in str(e.value)
    assert compute_backend("Darwin", "arm64") == "metal" and compute_backend("Linux", "x86_64") == "cpu"
    assert published_cpu_weights("metal", "float32") == "stored"
    assert published_cpu_weights("cpu", "float32") == "float32"
