"""``State.usage``: when each instance was last used and how long it stays loaded once idle
(docs/models.md "Placement on demand and idle unload"). Pure; ``exo_p2p.state.apply`` calls it.

Rules: ``InstanceUsed`` sets ``last_used`` to its time (never backwards: a late event does not
bring a deadline forward) and, when given, the keep-alive (negative: forever, stored as None);
an instance created to replace another (``Instance.replaces``: a re-placement, a restore, a
move) inherits that one's entry, so a failover or a move keeps its deadline; the entry goes
with its instance.
"""

from __future__ import annotations

import msgspec

from exo_p2p.types import Instance, InstanceUsage, InstanceUsed, State

replace = msgspec.structs.replace


def used(state: State, event: InstanceUsed) -> State:
    """``state`` with ``event`` recorded; an unknown instance changes nothing."""
    if event.instance_id not in state.instances:
        return state
    old = state.usage.get(event.instance_id)
    entry = old if old is not None else InstanceUsage(last_used=event.at)
    changes: dict[str, object] = {"last_used": max(entry.last_used, event.at)}
    if event.keep_alive is not None:
        changes["keep_alive"] = None if event.keep_alive < 0 else float(event.keep_alive)
    if event.pinned is not None:
        changes["pinned"] = event.pinned
    if event.task:
        changes["served"] = True
    if event.on_demand is not None:
        changes["on_demand"] = event.on_demand
    return replace(state, usage={**state.usage, event.instance_id: replace(entry, **changes)})


def created(state: State, instance: Instance) -> dict[str, InstanceUsage]:
    """``State.usage`` once ``instance`` is created: the entry of the instance it replaces, if any."""
    inherited = state.usage.get(instance.replaces) if instance.replaces else None
    if inherited is None:
        return state.usage
    return {**state.usage, instance.instance_id: inherited}


def deleted(state: State, instance_id: str) -> dict[str, InstanceUsage]:
    """``State.usage`` without ``instance_id``'s entry."""
    if instance_id not in state.usage:
        return state.usage
    return {k: v for k, v in state.usage.items() if k != instance_id}


def model_expiry(state: State, model_id: str) -> float | None:
    """Unix seconds at which the last of ``model_id``'s instances may be unloaded once idle
    (the latest ``expires_at``); None when one of them is kept forever (no entry, pinned,
    keep-alive forever) or there is none."""
    latest: float | None = None
    for instance_id, instance in state.instances.items():
        if instance.model_id != model_id:
            continue
        entry = state.usage.get(instance_id)
        expires = entry.expires_at if entry is not None else None
        if expires is None:
            return None
        latest = expires if latest is None else max(latest, expires)
    return latest
