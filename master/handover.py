"""Memory handed over: a placement that does not fit unloads idle instances, least recently
used first, until it fits (docs/models.md "Placement on demand and idle unload").

Which instances may go (``candidates``): those with a keep-alive (``State.usage``; one placed
by hand with no keep-alive, one kept forever and a pinned one never go), no unfinished task
(never one serving a request), not failed; ordered by ``last_used``, oldest first (ties: id).
``place_with_handover`` tries the placement on State as it is, then on State without the
first candidate, the first two, ... (each removed instance's shard bytes given back to its
nodes' reported available memory, which lags behind until they re-report), and returns the
first placement that fits with the instances it needs gone. Pure; at most one try per candidate.

A refusal is ``PlacementBusy`` when it is only for now: the placement would fit once the
instances serving a request (with a keep-alive, so candidates once idle) are idle. The API
answers it 503 with ``Retry-After`` and does not remember it (``exo_p2p.api.demand.placer``'s
negative cache keeps only refusals that a finished request does not change).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from exo_p2p.types import Instance, State
from master.idle import busy
from master.placement.place import PlacementError

replace = msgspec.structs.replace


class PlacementBusy(PlacementError):
    """The placement does not fit now but would once the instances serving a request are idle."""


def candidates(state: State, *, serving: bool = False) -> list[str]:
    """Instance ids that may be unloaded to make room, least recently used first
    (``serving``: instead, those that may be once the request they serve ends)."""
    out = []
    for instance_id, usage in state.usage.items():
        instance = state.instances.get(instance_id)
        if instance is None or instance.failed_reason is not None or usage.expires_at is None:
            continue
        if busy(state, instance_id) == serving:
            out.append((usage.last_used, instance_id))
    return [i for _, i in sorted(out)]


def without(state: State, instance_id: str) -> State:
    """``state`` as the placement would see it once ``instance_id`` is unloaded: the instance
    gone, its shard bytes back in its nodes' reported available memory."""
    instance = state.instances[instance_id]
    nodes = dict(state.nodes)
    for shard in instance.shards:
        profile = nodes.get(shard.node_id)
        if profile is not None and profile.memory_available is not None:
            total = profile.memory_total if profile.memory_total is not None else profile.memory_available + shard.share_bytes
            nodes[shard.node_id] = replace(profile, memory_available=min(total, profile.memory_available + shard.share_bytes))
    instances = {k: v for k, v in state.instances.items() if k != instance_id}
    return replace(state, instances=instances, nodes=nodes)


def over_bound(state: State, instance: Instance) -> list[str]:
    """Nodes of ``instance`` that would keep more models than their ``max_loaded_models``
    (``--max-loaded-models``) with it placed on ``state``, sorted."""
    out = []
    for node_id in sorted({shard.node_id for shard in instance.shards}):
        profile = state.nodes.get(node_id)
        limit = profile.max_loaded_models if profile is not None else None
        if limit is None:
            continue
        models = {i.model_id for i in state.instances.values() if i.failed_reason is None and any(s.node_id == node_id for s in i.shards)}
        if len(models | {instance.model_id}) > limit:
            out.append(node_id)
    return out


def place_with_handover(state: State, place: Callable[[State], Instance]) -> tuple[Instance, tuple[str, ...]]:
    """``place(state)``, or, when it raises ``PlacementError`` or puts a node over its
    ``max_loaded_models``, ``place`` on ``state`` without the fewest least-recently-used
    ``candidates`` that make it fit (for a node over its bound, its own candidates): (the
    instance, the ids to unload first). Raises ``PlacementError`` saying why, with the
    candidates considered, when none fits even with every candidate gone (``PlacementBusy`` when
    it would fit with the instances serving a request gone too)."""
    pending, gone, trial = candidates(state), [], state
    first: str | None = None
    for _ in range(len(pending) + 1):
        try:
            instance = place(trial)
            over = over_bound(trial, instance)
            if not over:
                return instance, tuple(gone)
            limits = ", ".join(f"{n} at most {state.nodes[n].max_loaded_models}" for n in over)
            first = first or f"too many models on a node (--max-loaded-models: {limits})"
            pick = next((c for c in pending if any(s.node_id in over for s in trial.instances[c].shards)), None)
        except PlacementError as exc:
            first = first or str(exc)
            pick = pending[0] if pending else None
        if pick is None:
            break
        pending.remove(pick)
        trial, gone = without(trial, pick), [*gone, pick]
    idle = len(candidates(state))
    held = len(state.instances) - idle
    if serving := candidates(state, serving=True):
        trial = state
        for instance_id in (*candidates(state), *serving):
            trial = without(trial, instance_id)
        if _fits(trial, place):
            raise PlacementBusy(f"{first} (it fits once the {len(serving)} instance(s) serving a request are idle: "
                                f"{', '.join(serving)}; retry then)")
    raise PlacementError(f"{first} (unloading the {idle} idle instance(s) would not make room either; "
                         f"{held} other instance(s) are serving, pinned or kept until deleted)")


def _fits(state: State, place: Callable[[State], Instance]) -> bool:
    """Whether ``place(state)`` succeeds without putting a node over its ``max_loaded_models``."""
    try:
        return not over_bound(state, place(state))
    except PlacementError:
        return False
