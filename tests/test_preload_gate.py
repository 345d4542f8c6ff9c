"""``exo_p2p.node.preload_gate.settled``: the node's tokenizer preloader sees an instance only once
no runner of it on this node is starting (the GIL-holding load stays out of the start-up window)."""

from __future__ import annotations

import pytest

from exo_p2p.models.token_count import models_to_preload
from exo_p2p.node.preload_gate import settled
from exo_p2p.types import Instance, ShardMetadata, State
from exo_p2p.types.runner import RunnerFailed, RunnerLoading, RunnerReady, RunnerRunning, RunnerWarmingUp
from exo_p2p.types.state import RunnerRecord

pytestmark = pytest.mark.unit

NODE, OTHER, BOOT = "node-a", "node-b", "boot-1"


def _instance(instance_id: str, model: str, nodes: tuple[str, ...]) -> Instance:
    shards = tuple(ShardMetadata(n, f"{instance_id}-r{r}", r, len(nodes), 0, 4, 4, 100, BOOT) for r, n in enumerate(nodes))
    return Instance(instance_id, model, "pipeline", shards)


def _state(statuses: dict[str, tuple[str, object]]) -> State:
    """Instances i1 (m1 on NODE and OTHER), i2 (m2 on NODE); ``statuses``: runner id -> (node, status)."""
    runners = {rid: RunnerRecord(rid, rid.rsplit("-", 1)[0], node, status) for rid, (node, status) in statuses.items()}
    return State(instances={"i1": _instance("i1", "m1", (NODE, OTHER)), "i2": _instance("i2", "m2", (NODE,))}, runners=runners)


def test_an_instance_starting_here_is_hidden_from_the_preloader_until_its_runner_here_is_ready():
    starting = _state({"i1-r0": (NODE, RunnerLoading(1, 4)), "i1-r1": (OTHER, RunnerReady()), "i2-r0": (NODE, RunnerWarmingUp())})
    assert models_to_preload(settled(starting, NODE), NODE, BOOT) == ()
    half = _state({"i1-r0": (NODE, RunnerReady()), "i1-r1": (OTHER, RunnerLoading(1, 4)), "i2-r0": (NODE, RunnerWarmingUp())})
    assert models_to_preload(settled(half, NODE), NODE, BOOT) == ("m1",)  # only this node's runner counts
    done = _state({"i1-r0": (NODE, RunnerRunning()), "i2-r0": (NODE, RunnerFailed("x"))})
    assert settled(done, NODE) is done and models_to_preload(done, NODE, BOOT) == ("m1", "m2")


def test_an_instance_whose_runner_here_does_not_exist_yet_is_starting():
    """Right after the master placed it (before its runner's first status) it is hidden too;
    an instance with no shard here is not this node's business."""
    state = _state({"i1-r1": (OTHER, RunnerReady())})
    assert models_to_preload(settled(state, NODE), NODE, BOOT) == ()
    assert settled(state, OTHER) is state  # i1's runner on OTHER is ready; i2 has no shard on OTHER
