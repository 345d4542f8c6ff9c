"""What the master does on its own after applying an event (pure; docs/architecture.md#instance-lifecycle).

``react(state, event) -> tuple[Event, ...]`` is called by the master role after each event
it indexed, with the State that includes it. Returned events are sequenced right after.
"""

from __future__ import annotations

from master.placement.topology import ring_ip
from exo_p2p.types import (
    FINISHED_TASK_STATUSES,
    Event,
    InstanceFailed,
    LinkLost,
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
      ``exo_p2p.node.orphans``);
    - a node that restarted (its profile carries a new boot id) fails every instance with a
      shard placed on its previous boot: runners are never revived (docs/architecture.md#instance-lifecycle);
    - an address retracted (``LinkLost``: its prober was refused twice, docs/links.md) fails
      every instance whose ring has a hop to that address from that source (``ring_over``):
      the ring would otherwise wedge until its ranks are killed as stuck (45 s), while the
      re-placement can start now, over the pair's remaining addresses.
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
    if isinstance(event, LinkLost):
        lost: list[Event] = []
        for instance_id in ring_over(state, event.source, event.sink, event.address):
            lost.extend(_fail_instance(state, instance_id, f"its ring ran over {event.address}, which node "
                                                            f"{event.source} can no longer reach"))
        return tuple(lost)
    return ()


def ring_over(state: State, source: str, sink: str, address: str) -> list[str]:
    """Ids of the instances (sorted) whose ring has the hop ``source`` → ``sink`` at ``address``
    (the sink's IP): rank r's ``ring_address`` is where rank r−1 reaches it."""
    ip = ring_ip(address)
    out = []
    for instance_id, inst in sorted(state.instances.items()):
        shards = inst.shards
        if len(shards) > 1 and any(shards[r - 1].node_id == source and s.node_id == sink and ring_ip(s.ring_address) == ip
                                   for r, s in enumerate(shards)):
            out.append(instance_id)
    return out


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
