"""Per-row KV rollback of a left-padded batch cache (mlx-lm's ``BatchKVCache``).

After a verification pass every row of the batch holds ``1 + K`` new positions; row ``i``
keeps ``1 + accepted_i`` of them and drops the last ``drop[i]``. The positions all rows drop
are trimmed (``trim``: the shared write index moves back); a row dropping more is shifted
right by the difference and its left padding grows by as much (mlx-lm's own right-padding
``finalize``: ``dynamic_roll`` then ``left_padding += shift``, ``offset -= shift``), so its
dropped positions fall behind the write index or into its masked padding. Each row's RoPE
offset stays its own count of kept tokens. Cost: the trim is free; the shift copies the
layer's buffer once, only in steps where rows drop different counts.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx


def rollback_supported(cache: list[Any]) -> bool:
    """Whether every layer's cache can be rolled back per row (a ``BatchKVCache`` or its
    quantized kind, ``kvq.batch_cache``, which has the same ``trim``/``prepare``/``finalize``;
    the recurrent or rotating kinds cannot, so speculation stays off for such models)."""
    from worker.engine.kvq.layers import is_batch_kv

    return bool(cache) and all(is_batch_kv(c) for c in cache)


def rollback(cache: list[Any], drop: list[int]) -> None:
    """Drop the last ``drop[i]`` positions of row ``i`` in every layer of ``cache`` (one
    ``BatchKVCache`` per layer, ``len(drop)`` rows). Raises ``ValueError`` for a negative
    count or a row count that differs."""
    if any(d < 0 for d in drop):
        raise ValueError(f"negative rollback {drop}")
    if not drop or max(drop) == 0:
        return
    common = min(drop)
    rest = [d - common for d in drop]
    for c in cache:
        if c.offset.shape[0] != len(drop):
            raise ValueError(f"{len(drop)} rollbacks for {c.offset.shape[0]} rows")
        if common:
            c.trim(common)
        if any(rest):
            c.prepare(right_padding=rest)
            c.finalize()
