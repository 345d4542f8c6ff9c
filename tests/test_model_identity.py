"""One manifest per model name in placement (docs/models.md, ``master.model_identity``)."""

from __future__ import annotations

import msgspec
import pytest

from exo_p2p.types.manifest import HeldModel
from master.model_identity import chosen_digest, mismatched_nodes
from master.placement.place import PlacementError, place_instance
from tests.support.rules.placement_cluster import GIB, card, cluster


def _holding(state, held: dict[str, tuple[HeldModel, ...]]):
    nodes = {n: msgspec.structs.replace(p, held_models=held.get(n, ())) for n, p in state.nodes.items()}
    return msgspec.structs.replace(state, nodes=nodes)


def test_majority_manifest_wins_and_other_files_under_the_name_are_excluded() -> None:
    base = cluster([(8 * GIB, 8 * GIB)] * 3)
    n0, n1, n2 = sorted(base.nodes)
    state = _holding(base, {n0: (HeldModel("m", "bbbb"),), n1: (HeldModel("m", "aaaa"),),
                            n2: (HeldModel("m", "aaaa"),)})
    assert chosen_digest(state, "m") == "aaaa"
    assert list(mismatched_nodes(state, "m")) == [n0]
    # n0 has the most memory-tied smallest id, yet never hosts: its files differ
    inst = place_instance(state, card(4, 6 * GIB), min_nodes=1)
    assert {s.node_id for s in inst.shards} == {n1}
    with pytest.raises(PlacementError, match="holds other files under the name m"):
        place_instance(state, card(4, 6 * GIB), nodes=[n0])


def test_partial_copies_and_unpublished_manifests_do_not_exclude() -> None:
    base = cluster([(8 * GIB, 8 * GIB)] * 2)
    n0, n1 = sorted(base.nodes)
    state = _holding(base, {n0: (HeldModel("m", "bbbb", complete=False),), n1: (HeldModel("m", "aaaa"),)})
    assert mismatched_nodes(state, "m") == {}
    tie = _holding(base, {n0: (HeldModel("m", "bbbb"),), n1: (HeldModel("m", "aaaa"),)})
    assert chosen_digest(tie, "m") == "aaaa"  # a tie: the smallest digest, same on every master
    assert mismatched_nodes(base, "m") == {}
