"""Keep-alive and idle unload: which instances the master unloads because they sat idle past
their keep-alive, and the ``InstanceUsed`` events that move the deadline (docs/models.md
"Placement on demand and idle unload").

The deadline lives in State (``State.usage``, ``exo_p2p.state.usage``) as the master's wall
clock, so a new master after a failover unloads on the same schedule. An instance is unloaded
when all of these hold:

- it has a keep-alive (no entry, keep-alive forever, or pinned: never);
- no task of it is unfinished (never while a request runs on it; the deadline counts from
  the end of the last request, ``FinishGeneration``);
- it is ready (a loading instance is waited for; a failed one is left to ``master.replace``);
- ``now >= last_used + keep_alive``, and, for one no request has used yet, at least
  ``max(keep_alive, READY_GRACE)`` after this master first saw it ready (the request that
  placed it must get to it; the grace is the master's own clock, so a new master may keep
  such an instance a little longer, never less).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exo_p2p.state.views import instance_view
from exo_p2p.types import (FINISHED_TASK_STATUSES, Event, Instance, InstanceDeleted, InstanceUsed, PlaceInstance, State,
                           TaskDeleted, TaskStatusUpdated)

READY_GRACE = 10.0
"""Seconds a ready instance no request has used yet is kept at least (see the module docstring)."""


def busy(state: State, instance_id: str) -> bool:
    """Whether a task of ``instance_id`` is unfinished (queued or running)."""
    return any(r.task.instance_id == instance_id and r.status not in FINISHED_TASK_STATUSES for r in state.tasks.values())


def use_events(state: State, instance_id: str, now: float, keep_alive: float | None, *, task: bool) -> tuple[Event, ...]:
    """The ``InstanceUsed`` to sequence when ``instance_id`` is used at ``now`` (unix s) with
    the request's ``keep_alive`` (None: unchanged). None for an instance with no entry in
    ``State.usage``: placed by hand with no keep-alive, it stays until deleted whatever its
    requests say, and traffic on it adds no events (docs/models.md)."""
    if instance_id not in state.usage:
        return ()
    return (InstanceUsed(instance_id, now, keep_alive=keep_alive, task=task),)


def unload_events(state: State, instance_id: str, reason: str | None = None) -> tuple[Event, ...]:
    """The events that unload ``instance_id`` (``InstanceDeleted`` with ``reason``: ``idle``,
    ``request``, ``room`` or None by hand; its unfinished tasks, if any, fail first so their
    clients get an error)."""
    events: list[Event] = [InstanceDeleted(instance_id, reason=reason)]
    for task_id, record in sorted(state.tasks.items()):
        if record.task.instance_id == instance_id and record.status not in FINISHED_TASK_STATUSES:
            events += [TaskStatusUpdated(task_id, "failed"), TaskDeleted(task_id)]
    return tuple(events)


def idle_reason(state: State, instance_id: str) -> str:
    """Why the master unloads ``instance_id`` once due: ``request`` when a request asked for
    keep-alive 0 (Ollama's unload idiom), else ``idle`` (its keep-alive ran out)."""
    usage = state.usage.get(instance_id)
    return "request" if usage is not None and usage.keep_alive == 0 else "idle"


@dataclass
class IdleClock:
    """The master's side of idle unload: when it first saw each instance ready (its wall
    clock, unix s), for ``READY_GRACE``; ``due`` the instances to unload now."""

    ready_seen: dict[str, float] = field(default_factory=dict)
    busy_seen: dict[str, float] = field(default_factory=dict)
    """When this master last saw a task of each instance unfinished: the deadline counts from
    then too, since a runner's "complete" may be indexed before the API node's
    ``FinishGeneration`` (which sets ``last_used``) while the last chunks are still on their way."""

    def due(self, state: State, now: float) -> tuple[str, ...]:
        """Instance ids of ``state`` to unload at ``now`` (unix s), sorted (module docstring)."""
        out: list[str] = []
        for instance_id, usage in sorted(state.usage.items()):
            instance = state.instances.get(instance_id)
            expires = usage.expires_at
            if instance is None or expires is None:
                continue
            if busy(state, instance_id):
                self.busy_seen[instance_id] = now
                continue
            if instance_view(state, instance).status != "ready":
                continue
            seen = self.ready_seen.setdefault(instance_id, now)
            keep = usage.keep_alive or 0.0
            expires = max(expires, self.busy_seen.get(instance_id, expires - keep) + keep)
            if not usage.served:
                expires = max(expires, seen + max(keep, READY_GRACE))
            if now >= expires:
                out.append(instance_id)
        self.ready_seen = {k: v for k, v in self.ready_seen.items() if k in state.instances}
        self.busy_seen = {k: v for k, v in self.busy_seen.items() if k in state.instances}
        return tuple(out)


def placement_usage(command: PlaceInstance, now: float) -> tuple[Event, ...]:
    """The ``InstanceUsed`` a placement starts with: its keep-alive (negative: forever), pin
    and on-demand mark at ``now``; none for a placement by hand with none of them (forever)."""
    if command.keep_alive is None and not command.pin and not command.on_demand:
        return ()
    keep = command.keep_alive if command.keep_alive is not None else -1.0
    return (InstanceUsed(command.command_id, now, keep_alive=keep, pinned=command.pin, on_demand=command.on_demand),)


def on_demand_existing(state: State, model_id: str) -> Instance | None:
    """An instance of ``model_id`` that is loading or ready (not failed), for a placement on
    demand to answer instead of placing a second one; None when there is none."""
    for instance_id in sorted(state.instances):
        instance = state.instances[instance_id]
        if instance.model_id == model_id and instance.failed_reason is None and instance_view(state, instance).status != "failed":
            return instance
    return None
