"""Bringing a shrunk instance back to its placed size (docs/cluster.md#failures).

When a node of a multi-rank instance leaves, the re-placement (``master.replace``) may fit
only on fewer nodes: the successor is *shrunk* and records the placement it stands in for
(``Instance.placed``). Once those nodes are back the master places the full-size instance
again, beside the shrunk one, and switches over without losing a request:

1. **start** (``restore_step`` with ``start=True``): a shrunk instance that is ready and has no
   task in flight, whose placed nodes are all in State and reachable, and whose last restore
   started at least ``RESTORE_INTERVAL`` seconds ago, gets a successor placed on exactly those
   nodes at the placed size (``replaces`` = the shrunk one, ``restores=True``), counting the
   memory the shrunk one still holds. One restore at a time in the cluster; a placement that
   does not fit is checked again after ``RECHECK_INTERVAL`` seconds.
2. **switch**: while the successor loads, the shrunk instance serves. Once the successor is
   ready, new requests go to it (``draining``) and the shrunk instance is deleted as soon as
   it has no task in flight.
3. **abandon**: a successor that fails is deleted (the shrunk one keeps serving; the next try
   waits for the interval); a shrunk instance that fails while its successor loads is deleted
   (the successor, at full size, takes over) instead of being re-placed.

Pure: the master role (``master.role``) keeps the per-instance ``not_before`` times (its
monotonic clock; a new master starts with none) and sequences the events.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import msgspec

from exo_p2p.state.views import instance_view
from exo_p2p.types import FINISHED_TASK_STATUSES, Event, Instance, InstanceCreated, InstanceDeleted, State
from master.placement.keep_layers import keep_shard_layers, placed_shards
from master.placement.memory import usable_memory
from master.placement.place import PlacementError, place_instance

RESTORE_INTERVAL = 60.0
"""Seconds after a restore of an instance started before another one of it may start."""
RECHECK_INTERVAL = 5.0
"""Seconds before a restore whose placement did not fit is checked again."""


class RestorePlan(msgspec.Struct, frozen=True):
    """What ``restore_step`` decided: ``events`` to sequence; ``instance_id``: the shrunk
    instance a restore was tried for (None: none), not to be tried again for ``wait`` seconds;
    ``why``: the reason it could not start (``""``: it started, or nothing was tried)."""

    events: tuple[Event, ...] = ()
    instance_id: str | None = None
    wait: float = 0.0
    why: str = ""


def in_flight(state: State, instance_id: str) -> int:
    """Tasks of ``instance_id`` not finished yet (queued or generating)."""
    return sum(1 for r in state.tasks.values() if r.task.instance_id == instance_id and r.status not in FINISHED_TASK_STATUSES)


def _pending(state: State) -> list[tuple[Instance, Instance]]:
    """(successor, shrunk instance) of every restore under way, by successor id."""
    return [(inst, state.instances[inst.replaces]) for _, inst in sorted(state.instances.items())
            if inst.restores and inst.replaces is not None and inst.replaces in state.instances]


def restore_under_way(state: State) -> bool:
    """Whether a restore (or a move, ``master.relink``) is under way: a successor whose
    instance it stands in for still exists."""
    return bool(_pending(state))


def handled_by_restore(state: State, instance: Instance) -> bool:
    """Whether a failed ``instance`` is this module's to remove rather than re-placement's: a
    successor whose shrunk instance still exists, or a shrunk instance whose successor is alive."""
    for new, old in _pending(state):
        if instance.instance_id == new.instance_id or (instance.instance_id == old.instance_id and new.failed_reason is None):
            return True
    return False


def draining(state: State) -> frozenset[str]:
    """Shrunk instances whose successor is ready: new requests should go to the successor."""
    return frozenset(old.instance_id for new, old in _pending(state)
                     if new.failed_reason is None and instance_view(state, new).status == "ready")


def _finish(state: State, new: Instance, old: Instance) -> tuple[Event, ...]:
    """The switch and abandon steps (module doc) for one restore under way."""
    if new.failed_reason is not None:
        return (InstanceDeleted(new.instance_id),)
    if old.failed_reason is not None:
        return (InstanceDeleted(old.instance_id),)
    if instance_view(state, new).status == "ready" and in_flight(state, old.instance_id) == 0:
        return (InstanceDeleted(old.instance_id),)
    return ()


def restorable(state: State, instance: Instance, reachable: Collection[str]) -> bool:
    """Whether ``instance`` may be restored now: shrunk, ready, no task in flight, and every
    node of its placement in State and in ``reachable`` (the nodes the master hears)."""
    if not instance.shrunk or instance.failed_reason is not None or in_flight(state, instance.instance_id):
        return False
    if any(p.node_id not in state.nodes or p.node_id not in reachable for p in instance.placed):
        return False
    return instance_view(state, instance).status == "ready"


def restore_step(
    state: State,
    *,
    reachable: Collection[str],
    now: float,
    not_before: Mapping[str, float],
    new_instance_id: str,
    start: bool = True,
) -> RestorePlan:
    """One pass of the rule (module doc) at ``now`` (seconds, the master's monotonic clock).

    ``not_before``: instance id → the earliest ``now`` a restore of it may be tried (absent:
    any time). ``start=False`` (``--no-restore-size``) only finishes restores under way.
    Returns the events of every restore under way that can move on; else, when none is under
    way, the start of at most one restore (the first restorable instance by id)."""
    pending = _pending(state)
    if pending:
        return RestorePlan(tuple(e for new, old in pending for e in _finish(state, new, old)))
    if not start:
        return RestorePlan()
    for instance_id, inst in sorted(state.instances.items()):
        if now < not_before.get(instance_id, now) or not restorable(state, inst, reachable):
            continue
        card = state.model_cards.get(inst.model_id)
        if card is None:
            return RestorePlan(instance_id=instance_id, wait=RECHECK_INTERVAL, why=f"model {inst.model_id!r} is no longer in the cluster")
        try:
            new = place_instance(state, card, min_nodes=inst.placed_ranks, sharding=inst.sharding,
                                 nodes=[p.node_id for p in inst.placed], instance_id=new_instance_id)
        except PlacementError as exc:
            return RestorePlan(instance_id=instance_id, wait=RECHECK_INTERVAL, why=str(exc))
        if new.world_size != inst.placed_ranks:
            return RestorePlan(instance_id=instance_id, wait=RECHECK_INTERVAL, why=f"placed on {new.world_size} ranks")
        usable = {s.node_id: usable_memory(state, s.node_id) for s in new.shards}
        new = keep_shard_layers(placed_shards(inst.placed, card.n_layers), new, usable)  # each node its layers back
        new = msgspec.structs.replace(new, replaces=instance_id, restores=True, settings=inst.settings)
        return RestorePlan((InstanceCreated(new),), instance_id=instance_id, wait=RESTORE_INTERVAL)
    return RestorePlan()
