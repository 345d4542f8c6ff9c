"""The pipeline split by measured speed (``master.placement.speed_split``, docs/placement-speed.md):
pure rules, through ``place_instance`` and its previews, and properties (hypothesis): the split
never breaks a node's memory rule, covers every layer once, is never slower by the estimate
than the memory-proportional split, and equal nodes keep today's split."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p.types import ModelCard, NetworkAddress, NodeProfile, NodeSpeed, State, TopologyEdge
from master.placement.place import place_instance, placement_previews
from master.placement.search import micro_batches
from master.placement.speed_split import MIN_GAIN, estimate, speed_shares, valid_speed
from master.placement.split import headroom_bytes, pipeline_shares

MIB = 1 << 20
FAST = NodeSpeed(decode_ns_per_kib=100, prefill_ns_per_kib=10, mem_mib_per_s=10_000)
SLOW = NodeSpeed(decode_ns_per_kib=333, prefill_ns_per_kib=33, mem_mib_per_s=3_000)


def smol_card(n_layers: int = 30, layer: int = 3 * MIB, emb: int = 24 * MIB) -> ModelCard:
    """A SmolLM2-like card: 30 layers, a tied embedding of ~8 layers' bytes (the last rank's head)."""
    return ModelCard(
        model_id="m", n_layers=n_layers, hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
        vocab_size=49152, context_length=2048, storage_size=n_layers * layer + emb + 1024,
        layer_bytes=(layer,) * n_layers, embedding_bytes=emb, head_bytes=0, norm_bytes=1024,
        tie_word_embeddings=True, activation_dtype_bytes=2,
    )


def cluster(mems: list[int], speeds: list[NodeSpeed | None], ips: list[str] | None = None) -> State:
    """Nodes n0.. with ``mems`` bytes (total = available), ``speeds``, a full loopback mesh."""
    ids = [f"n{i}" for i in range(len(mems))]
    ips = ips or ["127.0.0.1"] * len(ids)
    profiles = {nid: NodeProfile(nid, f"boot-{nid}", nid, mem, mem, models=("m",), backend="cpu", speed=sp,
                                 addrs=(NetworkAddress(f"/ip4/{ip}/tcp/1", ip, "", "loopback"),))
                for nid, mem, sp, ip in zip(ids, mems, speeds, ips, strict=True)}
    edges = {a: {b: TopologyEdge(a, b, ips[j], "loopback") for j, b in enumerate(ids) if a != b} for a in ids}
    return State(nodes=profiles, edges=edges)  # type: ignore[arg-type]


def layers(instance) -> list[int]:  # type: ignore[no-untyped-def]
    return [s.end_layer - s.start_layer for s in instance.shards]


def test_equal_nodes_keep_the_memory_split() -> None:
    for world in (2, 3, 4):
        st_ = cluster([1 << 30] * world, [FAST] * world)
        speed = place_instance(st_, smol_card(), min_nodes=world)
        memory = place_instance(st_, smol_card(), min_nodes=world, split="memory")
        assert layers(speed) == layers(memory), (world, layers(speed))


def test_a_slow_node_gets_fewer_layers_and_the_estimate_gains_at_least_half() -> None:
    card = smol_card()
    st_ = cluster([1 << 30, 1 << 30], [FAST, SLOW])
    speed = place_instance(st_, card, min_nodes=2)
    memory = place_instance(st_, card, min_nodes=2, split="memory")
    assert layers(memory) == [15, 15]
    fast_rank = next(s.rank for s in speed.shards if s.node_id == "n0")
    assert layers(speed)[fast_rank] > 15 + 5, layers(speed)
    # rank 0 moved along the cycle: the fast node is last and carries the output head
    assert memory.shards[0].node_id == "n0" and speed.shards[-1].node_id == "n0"
    (preview,) = [p for p in placement_previews(st_, card) if p.sharding == "pipeline" and p.world_size == 2]
    assert preview.memory_split_us_per_token is not None and preview.decode_us_per_token is not None
    assert preview.memory_split_us_per_token >= 1.5 * preview.decode_us_per_token
    assert preview.split_reason.startswith("by speed, rank 0 moved") and preview.prefill_us_per_token
    assert layers(preview.instance) == layers(speed)


def test_memory_caps_the_fast_node_with_headroom() -> None:
    card = smol_card()
    small = headroom_bytes(card.embedding_bytes + 1024 + 18 * 3 * MIB)  # room for 18 layers + the head
    st_ = cluster([1 << 30, small], [SLOW, FAST])
    speed = place_instance(st_, card, min_nodes=2)
    fast = next(s for s in speed.shards if s.node_id == "n1")
    assert headroom_bytes(fast.share_bytes) <= small and fast.end_layer - fast.start_layer <= 18


def test_unknown_or_absurd_speed_keeps_the_memory_split() -> None:
    card = smol_card()
    for bad in (None, NodeSpeed(0, 10, 10), NodeSpeed(10**9, 10, 10)):
        st_ = cluster([1 << 30, 1 << 30], [FAST, bad])
        assert layers(place_instance(st_, card, min_nodes=2)) == [15, 15]
    assert not valid_speed(msgspec.structs.replace(FAST, mem_mib_per_s=-1)) and valid_speed(FAST)


def test_micro_batches_only_when_every_node_has_a_host_of_its_own() -> None:
    assert micro_batches(cluster([1, 1], [None, None]), ("n0", "n1")) == 1
    assert micro_batches(cluster([1, 1, 1], [None] * 3, ["10.0.0.1", "10.0.0.2", "10.0.0.3"]), ("n0", "n1", "n2")) == 3


speeds_st = st.builds(NodeSpeed, st.integers(1, 5000), st.integers(1, 5000), st.integers(1, 100_000))


@settings(max_examples=150, deadline=None)
@given(n_layers=st.integers(2, 24), world=st.integers(2, 4), data=st.data())
def test_split_properties(n_layers: int, world: int, data: st.DataObject) -> None:
    """Every layer once, each rank ≥ 1 layer, the memory rule held, never slower than the
    memory split by the estimate; equal nodes give the memory split."""
    layer = data.draw(st.integers(1, 8)) * MIB
    card = smol_card(n_layers, layer, data.draw(st.integers(0, 16)) * MIB)
    usable = tuple(data.draw(st.integers(card.storage_size // world, 2 * card.storage_size)) for _ in range(world))
    speeds = tuple(data.draw(speeds_st) for _ in range(world))
    micro = data.draw(st.sampled_from([1, world]))
    memory = pipeline_shares(card, list(usable))
    if not isinstance(memory, list):
        return
    choice = speed_shares(card, usable, tuple(memory), speeds, micro, 50)
    assert choice is not None
    assert [s.start_layer for s in choice.shares] == [0] + [s.end_layer for s in choice.shares[:-1]]
    assert choice.shares[-1].end_layer == n_layers and all(s.end_layer > s.start_layer for s in choice.shares)
    for have, share in zip(usable, choice.shares, strict=True):
        assert share.share_bytes <= have
        if choice.shares != tuple(memory):
            assert headroom_bytes(share.share_bytes) <= have
    assert choice.decode_us <= choice.memory_decode_us == estimate(card, tuple(memory), speeds, micro, 50)
    if choice.shares != tuple(memory):
        assert choice.decode_us <= choice.memory_decode_us * (1 - MIN_GAIN)
    equal = pipeline_shares(card, [usable[0]] * world)
    if isinstance(equal, list):  # equal nodes: today's split, ±1 layer
        same = speed_shares(card, (usable[0],) * world, tuple(equal), (speeds[0],) * world, micro, 50)
        assert same is not None
        assert all(abs((a.end_layer - a.start_layer) - (b.end_layer - b.start_layer)) <= 1 for a, b in zip(same.shares, equal))
