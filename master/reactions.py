"""What the master does on its own after applying an event (pure; docs/architecture.md#instance-lifecycle).

``react(state, event) -> tuple[Event, ...]`` is called by the master role after each event
it indexed, with the State that includes it. Returned events are sequenced right after.
"""

from __future__ import annotations

from exo_p2p.types import (
    FINISHED_TASK_STATUSES,
    Event,
    InstanceFailed,
    NodeProfileUpdated,
    NodeTimedOut,
    RunnerFailed,
    RunnerStatusUpdated,
    State,
    TaskCancelRequested,
    TaskDeleted,
    TaskStatusUpdated,
)


def react(state: State, event: Event) -> tuple[Event, ...]:
    """Follow-up events:

    - a task reaching a finished status is removed (``TaskDeleted``), so State does not grow
      with traffic;
    - a runner that failed fails its instance (``InstanceFailed`` with the runner's error),
      and the instance's unfinished tasks fail and are removed;
    - a node that timed out fails every instance with a shard on it, and asks to cancel
      (``TaskCancelRequested``) every other unfinished task it submitted as API node: the
      client connection was on that node, so nobody waits for those tokens, and without it
      they decode to their token limit (or the context), holding batch rows and counting
      towards the queue limit of everyone else (a restarted API node cancels its own:
      ``exo_p2p.orphans``);
    - a node that restarted (its profile carries a new boot id) fails every instance with a
      shard placed on its previous boot: runners are never revived (docs/architecture.md#instance-lifecycle).
    """
    if isinstance(event, TaskStatusUpdated) and event.status in FINISHED_TASK_STATUSES:
        return (TaskDeleted(event.task_id),) if event.task_id in state.tasks else ()
    if isinstance(event, RunnerStatusUpdated) and isinstance(event.status, RunnerFailed):
        return _fail_instance(state, event.instance_id, f"runner on node {event.node_id} failed: {event.status.error}")
    if isinstance(event, NodeProfileUpdated):
        node, boot = event.profile.node_id, event.profile.boot_id
        out_r: list[Event] = []
        for instance_id, inst in sorted(state.instances.items()):
            if any(s.node_id == node and s.boot_id != boot for s in inst.shards):
                out_r.extend(_fail_instance(state, instance_id, f"node {node} restarted; its runners are not revived"))
        return tuple(out_r)
    if isinstance(event, NodeTimedOut):
        out: list[Event] = []
        for instance_id, inst in sorted(state.instances.items()):
            if any(s.node_id == event.node_id for s in inst.shards):
                out.extend(_fail_instance(state, instance_id, f"node {event.node_id} is gone"))
        ended = {e.task_id for e in out if isinstance(e, TaskDeleted)}
        for task_id, record in sorted(state.tasks.items()):
            if (record.task.api_node_id == event.node_id and task_id not in ended and not record.cancel_requested
                    and record.status not in FINISHED_TASK_STATUSES):
                out.append(TaskCancelRequested(task_id))
        return tuple(out)
    return ()


def _fail_instance(state: State, instance_id: str, reason: str) -> tuple[Event, ...]:
    instance = state.instances.get(instance_id)
    if instance is None or instance.failed_reason is not None:
        return ()
    out: list[Event] = [InstanceFailed(instance_id, reason)]
    for task_id, record in sorted(state.tasks.items()):
        if record.task.instance_id == instance_id and record.status not in FINISHED_TASK_STATUSES:
            out.append(TaskStatusUpdated(task_id, "failed"))
            out.append(TaskDeleted(task_id))
    return tuple(out)
