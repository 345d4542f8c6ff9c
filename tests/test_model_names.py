"""One set of files under two names (docs/models.md): a node holding the same bytes as two
models publishes both names with the one manifest, and ``GET /models/cluster`` lists every
(name, manifest) pair. The rules are pure (``exo_p2p.models.depot.held.held_models``,
``exo_p2p.api.model_routes.cluster_models``, ``instances_using``); the depot test reads real files, no process."""

from __future__ import annotations

import shutil
from pathlib import Path

from exo_p2p.api.model_routes import cluster_models, instances_using
from exo_p2p.models.depot.depot import ModelDepot
from exo_p2p.models.errors import ModelNotFoundError
from exo_p2p.models.depot.held import held_models
from exo_p2p.models.stores.store import ModelStore
from tests.support.models.synthetic_models import make_synthetic_model
from exo_p2p.types import Instance, NodeId, ShardMetadata, State
from exo_p2p.types.manifest import HeldModel
from exo_p2p.types.topology import NodeProfile

DIGEST = "d" * 64


def _no_embedded() -> Path:
    raise ModelNotFoundError("no embedded model in this test")


def test_two_names_of_one_manifest_are_both_held() -> None:
    held = held_models([("tiny", DIGEST), ("tiny-alias", DIGEST)], [])
    assert held == (HeldModel("tiny", DIGEST, True), HeldModel("tiny-alias", DIGEST, True))


def test_a_partial_copy_is_listed_unless_its_pair_is_held_complete() -> None:
    other = "e" * 64
    held = held_models([("tiny", DIGEST)], [("tiny", DIGEST, False), ("tiny-alias", DIGEST, False), ("big", other, False)])
    assert held == (HeldModel("big", other, False), HeldModel("tiny", DIGEST, True), HeldModel("tiny-alias", DIGEST, False))


def test_cluster_list_has_a_row_per_name_of_one_manifest() -> None:
    a, b = NodeId("node-a"), NodeId("node-b")
    nodes = {
        a: NodeProfile(node_id=a, boot_id="1", friendly_name="a", held_models=held_models([("tiny", DIGEST), ("tiny-alias", DIGEST)], [])),
        b: NodeProfile(node_id=b, boot_id="2", friendly_name="b", held_models=held_models([("tiny-alias", DIGEST)], [])),
    }
    assert cluster_models(State(nodes=nodes)) == [
        {"model": "tiny", "manifests": [{"digest": DIGEST, "complete": [a], "partial": []}]},
        {"model": "tiny-alias", "manifests": [{"digest": DIGEST, "complete": [a, b], "partial": []}]},
    ]


def test_instances_using_are_the_live_ones_with_a_shard_here() -> None:
    """``DELETE /models/{name}`` refuses while one of these runs: a live instance of the model
    with a shard on this node; failed ones, other models and other nodes' shards do not count."""

    def inst(iid: str, model: str, nodes: tuple[str, ...], failed: str | None = None) -> Instance:
        shards = tuple(ShardMetadata(NodeId(n), f"r{iid}{r}", r, len(nodes), 0, 4, 4, 0, "boot")  # type: ignore[arg-type]
                       for r, n in enumerate(nodes))
        return Instance(instance_id=iid, model_id=model, sharding="pipeline", shards=shards, failed_reason=failed)  # type: ignore[arg-type]

    state = State(instances={"b": inst("b", "tiny", ("x", "here")), "a": inst("a", "tiny", ("here",)),  # type: ignore[dict-item]
                             "c": inst("c", "tiny", ("here",), failed="gone"), "d": inst("d", "other", ("here",)),
                             "e": inst("e", "tiny", ("x",))})
    assert instances_using(state, "tiny", "here") == ["a", "b"]
    assert instances_using(state, "tiny", "nowhere") == []


def test_depot_publishes_every_name_of_the_same_files(tmp_path: Path) -> None:
    models = tmp_path / "models"
    make_synthetic_model(models / "tiny", n_layers=2, hidden_size=32, intermediate_size=64, seed=3)
    shutil.copytree(models / "tiny", models / "tiny-alias")
    store = ModelStore(tmp_path / "data", [models], find_embedded=_no_embedded, hf_cache=False)
    depot = ModelDepot(store, tmp_path / "data")
    depot.refresh()
    held = depot.held()
    assert [h.name for h in held] == ["tiny", "tiny-alias"]
    assert held[0].digest == held[1].digest and all(h.complete for h in held)
    assert depot.local_digest("tiny-alias") == depot.local_digest("tiny") == held[0].digest
    assert depot.source(held[0].digest) is not None
