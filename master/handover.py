"""Memory handed over: a placement that does not fit unloads idle instances, least recently
used first, until it fits (docs/models.md "Placement on demand and idle unload").

Which instances may go (``candidates``): those with a keep-alive (``State.usage``; one placed
by hand with no keep-alive, one kept forever and a pinned one never go), no unfinished task
(never one serving a request), not failed; ordered by ``last_used``, oldest first (ties: id).
``place_with_handover`` tries the placement on State as it is, then on State without the
first candidate, the first two, ... (each removed instance's shard bytes given back to its
nodes' reported available memory, which lags behind until they re-report), and returns the
first placement that fits with the instances it needs gone. Pure; at most one try per candidate.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from exo_p2p.types import Instance, State
from master.idle import busy
from master.placement.place import PlacementError

replace = msgspec.structs.replace


def candidates(state: State) -> list[str]:
    """Instance ids that may be unloaded to make room, least recently used first."""
    out = []
    for instance_id, usage in state.usage.items():
        instance = state.instances.get(instance_id)
        if instance is None or instance.failed_reason is not None or usage.expires_at is None:
            continue
        if not busy(state, instance_id):
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


def place_with_handover(state: State, place: Callable[[State], Instance]) -> tuple[Instance, tuple[str, ...]]:
    """``place(state)``, or, when it raises ``PlacementError``, ``place`` on ``state`` without
    the fewest least-recently-used ``candidates`` that make it fit: (the instance, the ids to
    unload first). Raises the first ``PlacementError``, with the candidates considered, when
    none fits even with every candidate gone."""
    try:
        return place(state), ()
    except PlacementError as exc:
        first = exc
    gone: list[str] = []
    trial = state
    for instance_id in candidates(state):
        trial = without(trial, instance_id)
        gone.append(instance_id)
        try:
            return place(trial), tuple(gone)
        except PlacementError:
            continue
    idle = len(gone)
    held = len(state.instances) - idle
    raise PlacementError(f"{first} (unloading the {idle} idle instance(s) would not make room either; "
                         f"{held} other instance(s) are serving, pinned or kept until deleted)") from first
