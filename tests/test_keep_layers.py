"""Re-placement onto the same nodes keeps each node's layers (``master.placement.keep_layers``),
so a restarted pipeline's ranks find their own prompt-cache disk blocks: the rule and its hook
in ``master.replace.replacement``."""

from __future__ import annotations

import msgspec
import pytest

from exo_p2p.state import apply
from exo_p2p.types import IndexedEvent, InstanceCreated, InstanceFailed, PlaceInstance, RankSettings
from master.commands import handle_command
from master.placement.keep_layers import keep_layers
from master.replace import replacement
from tests.support.rules.placement_cluster import card, cluster

pytestmark = pytest.mark.unit
GIB = 1 << 30
LAYER = GIB // 4


def failed_with_other_split(memory: list[tuple[int, int]]):
    """A cluster of ``memory`` holding a 2-node pipeline that ran with a split placement would
    not choose (node n1 first, three layers; n0 one), now failed; and State."""
    state = cluster(memory)
    state = msgspec.structs.replace(state, model_cards={"m": card(4, GIB)})
    (created,) = handle_command(state, PlaceInstance("p1", "m", min_nodes=2), rank_settings=RankSettings(16)).events
    assert isinstance(created, InstanceCreated)
    placed = created.instance
    by_node = {s.node_id: s for s in placed.shards}
    odd = (msgspec.structs.replace(by_node["n1"], rank=0, start_layer=0, end_layer=3, share_bytes=3 * LAYER, runner_id="p1-r0"),
           msgspec.structs.replace(by_node["n0"], rank=1, start_layer=3, end_layer=4, share_bytes=LAYER, runner_id="p1-r1"))
    instance = msgspec.structs.replace(placed, shards=odd)
    state = apply(state, IndexedEvent(1, 1, InstanceCreated(instance)))
    state = apply(state, IndexedEvent(1, 2, InstanceFailed(instance.instance_id, "both nodes restarted")))
    return state, state.instances[instance.instance_id]


def ranges(instance) -> dict[str, tuple[int, int, int]]:
    return {s.node_id: (s.rank, s.start_layer, s.end_layer) for s in instance.shards}


def successor(state, failed):
    created = next(e for e in replacement(state, failed, "p2") if isinstance(e, InstanceCreated))
    return created.instance


def test_a_successor_on_the_same_nodes_keeps_each_nodes_layers() -> None:
    state, failed = failed_with_other_split([(8 * GIB, 8 * GIB), (8 * GIB, 8 * GIB)])
    new = successor(state, failed)
    assert ranges(new) == {"n1": (0, 0, 3), "n0": (1, 3, 4)} == ranges(failed)
    assert [s.runner_id for s in sorted(new.shards, key=lambda s: s.rank)] == ["p2-r0", "p2-r1"]
    assert {s.node_id: s.share_bytes for s in new.shards} == {"n1": 3 * LAYER, "n0": LAYER}
    # without the rule placement splits otherwise: the rule is what keeps them
    from master.placement.place import place_instance

    fresh = place_instance(state, state.model_cards["m"], min_nodes=2, instance_id="p2")
    assert ranges(fresh) != ranges(failed)
    assert keep_layers(failed, fresh, {"n0": 8 * GIB, "n1": 8 * GIB}).shards == new.shards


def test_the_new_split_stands_when_an_old_share_no_longer_fits() -> None:
    state, failed = failed_with_other_split([(8 * GIB, 8 * GIB), (8 * GIB, 8 * GIB)])
    from master.placement.place import place_instance

    fresh = place_instance(state, state.model_cards["m"], min_nodes=2, instance_id="p2")
    assert keep_layers(failed, fresh, {"n0": 8 * GIB, "n1": 2 * LAYER}) == fresh  # n1's three layers do not fit
    assert keep_layers(failed, fresh, {"n0": 8 * GIB, "n1": None}) == fresh
    other_form = msgspec.structs.replace(failed, shards=tuple(msgspec.structs.replace(s, weights_dtype="float32")
                                                               for s in failed.shards))
    assert keep_layers(other_form, fresh, {"n0": 8 * GIB, "n1": 8 * GIB}) == fresh


def test_the_new_split_stands_on_other_nodes_or_another_sharding() -> None:
    state, failed = failed_with_other_split([(8 * GIB, 8 * GIB), (8 * GIB, 8 * GIB), (8 * GIB, 8 * GIB)])
    events = replacement(state, failed, "p2", unreachable=frozenset({"n1"}))
    new = next(e for e in events if isinstance(e, InstanceCreated)).instance
    assert "n1" not in ranges(new)
    tensor = msgspec.structs.replace(failed, sharding="tensor")
    from master.placement.place import place_instance

    fresh = place_instance(state, state.model_cards["m"], min_nodes=2, instance_id="p2")
    assert keep_layers(tensor, fresh, {n: 8 * GIB for n in ("n0", "n1", "n2")}) == fresh


def test_a_restore_to_full_size_gives_each_node_its_layers_back() -> None:
    """Both nodes restarted, the first back alone: the instance was re-placed shrunk on it (its
    ``placed`` records each node's layers); the other back, the size restore
    (``master.restore.restore_step``) places the 2-node instance with those layers."""
    from exo_p2p.types import InstanceDeleted
    from master.restore import restore_step
    from tests.support.rules.restore_size import _ready, _with

    state, failed = failed_with_other_split([(64 * GIB, 64 * GIB), (64 * GIB, 64 * GIB)])
    events = replacement(state, failed, "s", unreachable=frozenset({"n0"}))  # n1 back first, n0 not yet
    assert isinstance(events[0], InstanceDeleted) and isinstance(events[1], InstanceCreated)
    shrunk = events[1].instance
    assert shrunk.world_size == 1 and [(p.node_id, p.start_layer, p.end_layer) for p in shrunk.placed] == \
        [("n1", 0, 3), ("n0", 3, 4)]
    back = _ready(_with(state, shrunk), shrunk)
    plan = restore_step(back, reachable=frozenset({"n0", "n1"}), now=100.0, not_before={}, new_instance_id="r")
    (created,) = plan.events
    assert isinstance(created, InstanceCreated)
    assert ranges(created.instance) == ranges(failed) == {"n1": (0, 0, 3), "n0": (1, 3, 4)}
