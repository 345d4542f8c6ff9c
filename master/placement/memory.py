"""Memory a node can still give, from State (docs/architecture.md#rules "Memory rule").

A node's profile (``memory_available``) is re-published only when its available memory moves
by 256 MiB, and only once its runners have loaded, so it lags behind the placements the
master has already made. The master knows every shard it placed, so the memory a node can
still give is

    usable(n) = min(reported memory_available,
                    memory_total − Σ share_bytes of the shards State places on n)

(``memory_total`` is already capped by ``--memory-limit`` in the profile). A placement thus
counts the moment its ``InstanceCreated`` is applied, whatever the node has published.
Shards of failed instances are not counted: their runners shut down (the reported available
memory still counts them until the node re-reports, so the minimum stays on the safe side).

One rule for placement (``master.placement.place``), its previews, and memory admission
(``master.admission``).
"""

from __future__ import annotations

from exo_p2p.types import NodeId, State


def placed_bytes(state: State, node_id: NodeId) -> int:
    """Bytes (Σ ``ShardMetadata.share_bytes``) of the shards of ``state``'s live (not failed)
    instances on ``node_id``; 0 when it hosts none."""
    return sum(
        shard.share_bytes
        for instance in state.instances.values()
        if instance.failed_reason is None
        for shard in instance.shards
        if shard.node_id == node_id
    )


def usable_memory(state: State, node_id: NodeId) -> int | None:
    """Bytes ``node_id`` can still give to new shards or to a prompt's KV cache and
    activations: ``min(memory_available, memory_total − placed_bytes)``, never below 0.

    None when the node is not in State or has not reported its memory (callers decide what
    an unknown means: placement excludes the node, admission admits the prompt)."""
    profile = state.nodes.get(node_id)
    if profile is None or profile.memory_available is None:
        return None
    usable = profile.memory_available
    if profile.memory_total is not None:
        usable = min(usable, profile.memory_total - placed_bytes(state, node_id))
    return max(0, usable)
