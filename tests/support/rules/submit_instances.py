"""Two ready instances for the submit rules."""

from __future__ import annotations

from exo_p2p.types import MasterElected, NodeModelsUpdated, NodeProfile, NodeProfileUpdated, PlaceInstance, RunnerReady, RunnerStatusUpdated, State
from master.commands import handle_command
from tests.support.rules.strategies import CARD
from tests.support.rules.master_run import GIB, run


def two_ready_instances():  # type: ignore[no-untyped-def]
    """node-a (master) and node-b, each with a ready 1-node instance of ``CARD``."""
    s = run(
        State(),
        [MasterElected("node-a", 1)]
        + [e for n in ("node-a", "node-b") for e in (
            NodeProfileUpdated(NodeProfile(n, "boot-1", n, memory_total=16 * GIB, memory_available=16 * GIB)),
            NodeModelsUpdated(n, (CARD,)),
        )],
    )
    ids = {}
    for n in ("node-a", "node-b"):
        d = handle_command(s, PlaceInstance(f"place-{n}", CARD.model_id, nodes=(n,)))
        assert d.result.error is None, d.result.error
        s = run(s, d.events)
        inst = d.result.instance
        shard = inst.shards[0]
        s = run(s, [RunnerStatusUpdated(shard.runner_id, inst.instance_id, shard.node_id, RunnerReady())])
        ids[n] = inst.instance_id
    return s, ids
