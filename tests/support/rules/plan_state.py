"""States, instances and tasks for the worker's plan."""

from __future__ import annotations

from exo_p2p.types import ChatMessage, GenerationParams, Instance, RunnerRecord, ShardMetadata, State, TaskRecord, TextGeneration


NODE, BOOT = "node-a", "boot-1"


def instance(instance_id="i1", node=NODE, boot=BOOT, world=1):
    shards = tuple(
        ShardMetadata(node if r == 0 else f"node-{r}", f"{instance_id}-r{r}", r, world, 0, 4, 4, 100, boot) for r in range(world)
    )
    return Instance(instance_id, "m", "pipeline", shards)


def state_with(inst, runner_statuses=None, tasks=()):
    runners = {}
    for shard in inst.shards:
        st_ = (runner_statuses or {}).get(shard.runner_id)
        if st_ is not None:
            runners[shard.runner_id] = RunnerRecord(shard.runner_id, inst.instance_id, shard.node_id, st_)
    return State(
        instances={inst.instance_id: inst},
        runners=runners,
        tasks={t.task_id: TaskRecord(t) for t in tasks},
    )


def gen_task(tid, idx, inst="i1"):
    return TextGeneration(tid, inst, "m", GenerationParams((ChatMessage("user", "x"),)), NODE, created_idx=idx)
