"""Re-placement onto the same nodes keeps each node's layers (docs/architecture.md "Prompt cache
disk tier").

A pipeline rank's prompt-cache disk tier holds the KV of its own layers, named by its layer
range (``worker.engine.cache.identity.tier_directory``). When both nodes of a 2-node pipeline
restarted, the master re-placed the instance with another split (placement is free to choose
any ring order and split), so each node held blocks of the other's layers and every turn
started cold. The rule: when a successor is placed on exactly the nodes its failed instance
ran on, in the same ring order up to a rotation (each node's ring neighbours, hence its ring
address, unchanged), each node keeps its old layer range and rank — if the node's old share
still fits its usable memory and its runner holds the weights in the same form (the share's
bytes were computed for that form). Otherwise the new placement stands as placed.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from exo_p2p.types import Instance, PlacedNode, RunnerId, ShardMetadata


def _rotation(old: list[str], new: list[str]) -> bool:
    """Whether ``new`` is ``old`` rotated (same cyclic order, same direction)."""
    if len(old) != len(new) or set(old) != set(new):
        return False
    start = new.index(old[0])
    return new[start:] + new[:start] == old


def placed_shards(placed: tuple[PlacedNode, ...], n_layers: int) -> tuple[ShardMetadata, ...]:
    """The shards a shrunk instance's ``placed`` nodes held (rank = position), or ``()`` when
    any node's layers were not recorded (``PlacedNode.end_layer`` 0)."""
    if not placed or any(p.end_layer <= p.start_layer for p in placed):
        return ()
    return tuple(ShardMetadata(p.node_id, RunnerId(""), rank, len(placed), p.start_layer, p.end_layer, n_layers,
                               p.share_bytes, "", weights_dtype=p.weights_dtype or "stored")
                 for rank, p in enumerate(placed))


def keep_layers(failed: Instance, new: Instance, usable: Mapping[str, int | None]) -> Instance:
    """``new`` (the successor placed for ``failed``) with every shard given the layers, rank
    and share its node had in ``failed`` when the rule of the module docstring allows it;
    else ``new`` unchanged. ``usable``: each node's usable memory in bytes
    (``master.placement.memory.usable_memory``; None: not reported, then ``new`` stands).
    Pure; never raises for a mismatch, it just keeps ``new``."""
    if failed.sharding != "pipeline":
        return new
    return keep_shard_layers(failed.shards, new, usable)


def keep_shard_layers(old: tuple[ShardMetadata, ...], new: Instance, usable: Mapping[str, int | None]) -> Instance:
    """``keep_layers`` from the shards a pipeline held before (``old``, any order; from a
    failed instance, or ``placed_shards`` of a shrunk one being restored)."""
    failed = msgspec.structs.replace(new, shards=old)
    if new.sharding != "pipeline" or len(old) < 2:
        return new
    old_order = [s.node_id for s in sorted(failed.shards, key=lambda s: s.rank)]
    new_order = [s.node_id for s in sorted(new.shards, key=lambda s: s.rank)]
    if not _rotation(old_order, new_order):
        return new
    placed = {s.node_id: s for s in new.shards}
    shards = []
    for old in sorted(failed.shards, key=lambda s: s.rank):
        now = placed[old.node_id]
        room = usable.get(old.node_id)
        if (old.n_layers != now.n_layers or old.weights_dtype != now.weights_dtype or room is None
                or old.share_bytes > room):
            return new
        shards.append(msgspec.structs.replace(
            now, rank=old.rank, start_layer=old.start_layer, end_layer=old.end_layer, share_bytes=old.share_bytes,
            runner_id=RunnerId(f"{new.instance_id}-r{old.rank}")))
    if [(s.node_id, s.start_layer, s.end_layer) for s in shards] == \
            [(s.node_id, s.start_layer, s.end_layer) for s in sorted(new.shards, key=lambda s: s.rank)]:
        return new
    return msgspec.structs.replace(new, shards=tuple(shards))
