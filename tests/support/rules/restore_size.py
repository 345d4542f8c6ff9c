"""Ready instances and tasks for the restore-size rules."""

from __future__ import annotations

import msgspec

from exo_p2p.types import ChatMessage, GenerationParams, Instance, RunnerReady, RunnerRecord, State, TaskRecord, TextGeneration


def _ready(state: State, inst: Instance, status=None) -> State:  # type: ignore[no-untyped-def]
    runners = dict(state.runners)
    for s in inst.shards:
        runners[s.runner_id] = RunnerRecord(s.runner_id, inst.instance_id, s.node_id, status or RunnerReady())
    return msgspec.structs.replace(state, runners=runners)


def _with(state: State, *instances: Instance) -> State:
    return msgspec.structs.replace(state, instances={**state.instances, **{i.instance_id: i for i in instances}})


def _task(state: State, task_id: str, instance_id: str, status: str = "running") -> State:
    task = TextGeneration(task_id, instance_id, "m", GenerationParams((ChatMessage("user", "hi"),)), "n0")  # type: ignore[arg-type]
    return msgspec.structs.replace(state, tasks={**state.tasks, task_id: TaskRecord(task, status)})  # type: ignore[arg-type]
