"""The worker's pure planner: ``plan(...) -> Task | None`` (docs/architecture.md#request-flow "Plan").

Called in a loop with the replicated State and this node's view of its own runners; returns
the next task to execute, or None when there is nothing to do. Idempotent: a task recorded
in ``LocalRunner.sent`` is never returned again, so calling ``plan`` twice on the same
inputs returns the same single task (docs/architecture.md#rules "Plan is idempotent").
"""

from __future__ import annotations

from collections.abc import Container

import msgspec

from exo_p2p.types import (
    SERVING_STATUSES,
    TERMINAL_STATUSES,
    CancelTask,
    ConnectToGroup,
    CreateRunner,
    Instance,
    LoadModel,
    NodeId,
    RunnerConnected,
    RunnerFailed,
    RunnerIdle,
    RunnerLoaded,
    RunnerStatus,
    Shutdown,
    StartWarmup,
    State,
    Task,
    WorkTask,
)

LIFECYCLE_KEYS = frozenset({"connect", "load", "warmup", "shutdown"})
"""Keys of ``LocalRunner.sent`` that are not task ids."""

_PAST_LOADED = ("loaded", "warming_up", "ready", "running")
_PAST_CONNECTED = ("connected", "loading", "loaded", "warming_up", "ready", "running")


class LocalRunner(msgspec.Struct, frozen=True):
    """A runner this node started (alive or ended): its latest status as the supervisor saw
    it and the keys of the tasks already sent to it (``"connect"``, ``"load"``,
    ``"warmup"``, ``"shutdown"``, generation task ids, ``"cancel:<task id>"``)."""

    runner_id: str
    instance_id: str
    status: RunnerStatus
    sent: frozenset[str] = frozenset()


class ForwardTask(msgspec.Struct, frozen=True):
    """Forward the master's work ``task`` (any kind: ``WorkTask``) to this node's runner
    ``runner_id``; the runner's engine does the kinds its model does (the master routed it
    only to an instance whose card lists the kind)."""

    runner_id: str
    task: WorkTask


PlannedTask = Task | ForwardTask


def _tag(status: RunnerStatus | None) -> str:
    return "" if status is None else type(status).__struct_config__.tag  # type: ignore[attr-defined]


def _all_runners(state: State, instance: Instance, tags: tuple[str, ...]) -> bool:
    for shard in instance.shards:
        record = state.runners.get(shard.runner_id)
        if record is None or _tag(record.status) not in tags:
            return False
    return True


def plan(node_id: NodeId, boot_id: str, state: State, local: dict[str, LocalRunner]) -> PlannedTask | None:
    """The next task for this node's worker, in this order of rules:

    1. a live local runner whose instance is gone or failed → ``Shutdown``;
    2. a shard of a live instance placed on this node *in this boot* with no local runner
       → ``CreateRunner`` (a runner id that ever ran here is never created again);
    3. lifecycle: Idle → ``ConnectToGroup`` (multi-rank, once every rank's runner exists and
       none is Downloading its shard)
       or ``LoadModel`` (single rank); Connected → ``LoadModel`` once every rank is
       connected; Loaded → ``StartWarmup`` once every rank has loaded;
    4. ``CancelTask`` for a task sent to this runner whose cancellation was requested;
    5. ``ForwardTask`` of each pending task of the instance, in the master's
       ``TaskCreated`` order, to a runner that is Ready or Running, once every runner of the
       instance is Ready or Running — a task whose cancellation was requested before it
       reached the runner too, so that the runner (its ranks in agreement) ends it as
       cancelled at once (rule 4 follows): nothing else would ever end it, and it would stay
       in State for good, counting towards the instance's load and queue limit.
    """
    for runner in sorted(local.values(), key=lambda r: r.runner_id):
        if isinstance(runner.status, TERMINAL_STATUSES) or "shutdown" in runner.sent:
            continue
        instance = state.instances.get(runner.instance_id)
        if instance is None or instance.failed_reason is not None:
            return Shutdown(runner_id=runner.runner_id)

    for instance_id, instance in sorted(state.instances.items()):
        if instance.failed_reason is not None:
            continue
        shard = instance.shard_for(node_id)
        if shard is None or shard.boot_id != boot_id or shard.runner_id in local:
            continue
        return CreateRunner(instance=instance, shard=shard)

    for runner in sorted(local.values(), key=lambda r: r.runner_id):
        if isinstance(runner.status, TERMINAL_STATUSES) or "shutdown" in runner.sent:
            continue
        instance = state.instances.get(runner.instance_id)
        if instance is None:
            continue
        task = _lifecycle(state, instance, runner)
        if task is not None:
            return task
        task = _generation(state, instance, runner)
        if task is not None:
            return task
    return None


def _lifecycle(state: State, instance: Instance, runner: LocalRunner) -> Task | None:
    status = runner.status
    multi = instance.world_size > 1
    if isinstance(status, RunnerIdle):
        if not multi:
            return None if "load" in runner.sent else LoadModel(runner_id=runner.runner_id)
        # every rank's runner exists, none still fetching its shard (Downloading: no process yet)
        if "connect" not in runner.sent and all(
            s.runner_id in state.runners and _tag(state.runners[s.runner_id].status) != "downloading"
            for s in instance.shards
        ):
            return ConnectToGroup(runner_id=runner.runner_id)
        return None
    if isinstance(status, RunnerConnected):
        if "load" not in runner.sent and _all_runners(state, instance, _PAST_CONNECTED):
            return LoadModel(runner_id=runner.runner_id)
        return None
    if isinstance(status, RunnerLoaded):
        if "warmup" not in runner.sent and _all_runners(state, instance, _PAST_LOADED):
            return StartWarmup(runner_id=runner.runner_id)
    return None


def _generation(state: State, instance: Instance, runner: LocalRunner) -> PlannedTask | None:
    records = sorted(
        (r for r in state.tasks.values() if r.task.instance_id == instance.instance_id),
        key=lambda r: (r.task.created_idx, r.task.task_id),
    )
    for record in records:
        tid = record.task.task_id
        if record.cancel_requested and tid in runner.sent and f"cancel:{tid}" not in runner.sent:
            if record.status in ("pending", "running"):
                return CancelTask(runner_id=runner.runner_id, task_id=tid)
    if not isinstance(runner.status, SERVING_STATUSES) or isinstance(runner.status, RunnerFailed):
        return None
    if not _all_runners(state, instance, ("ready", "running")):
        return None
    for record in records:
        tid = record.task.task_id
        if tid in runner.sent or record.status not in ("pending", "running"):
            continue
        return ForwardTask(runner.runner_id, record.task)
    return None


def still_listed(sent: set[str] | frozenset[str], tasks: Container[str]) -> set[str]:
    """The keys of ``sent`` (a runner's record of what was sent to it) to keep: the lifecycle
    keys, and the keys of tasks ``tasks`` (State's task ids) still lists. ``plan`` looks a
    task's keys up only while State holds the task, so dropping the others changes no plan
    (tests/test_runner_sent.py); without it the record grows by every request a runner ever
    served (and is copied on each plan pass: a runner serving for days slowed every event down)."""
    return {k for k in sent if k in LIFECYCLE_KEYS or k.removeprefix("cancel:") in tasks}
