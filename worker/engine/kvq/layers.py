"""One sequence's KV, full precision or quantized: made, merged, copied, kept as arrays.

A sequence's own cache (while it prefills alone, and in the prompt cache) is one mlx-lm
``KVCache`` per layer at full precision, or one ``QuantizedKVCache`` (``--kv-cache-bits``);
rows join a batch through ``merge_rows``, which picks the matching batch cache
(``BatchKVCache`` or ``kvq.batch_cache.QuantizedBatchKVCache``). The prompt cache and its disk
tier keep a layer as a flat list of arrays: keys, values (full precision) or the packed
words, scales and biases of each (quantized: six arrays), ``layer_arrays``/``from_arrays``.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache, QuantizedKVCache

from exo_p2p.models.kv_bytes import group_size
from worker.engine.kvq.batch_cache import QuantizedBatchKVCache


def quantized(caches: list[Any], bits: int, head_dim: int) -> list[Any]:
    """``caches`` (a fresh ``forward.new_cache``) with every empty ``KVCache`` replaced by a
    ``QuantizedKVCache`` of ``bits`` (0: ``caches`` as they are). Raises ``ValueError`` for a
    head size ``exo_p2p.models.kv_bytes.group_size`` refuses."""
    if not bits:
        return caches
    group = group_size(head_dim)
    return [QuantizedKVCache(group_size=group, bits=bits) if type(c) is KVCache else c for c in caches]


def quantized_filled(caches: list[Any], bits: int, head_dim: int) -> list[Any]:
    """``caches`` (a sequence's, possibly holding keys, e.g. a vision row's prefill) with every
    full-precision ``KVCache`` quantized to ``bits`` (mlx-lm's ``KVCache.to_quantized``; 0:
    ``caches`` as they are), so that it merges with the batch's quantized rows."""
    if not bits:
        return caches
    group = group_size(head_dim)
    return [c.to_quantized(group_size=group, bits=bits) if type(c) is KVCache else c for c in caches]


def merge_rows(rows: list[Any]) -> Any:
    """One layer's batch cache holding ``rows`` (one sequence cache each, of one kind)."""
    if isinstance(rows[0], QuantizedKVCache):
        return QuantizedBatchKVCache.merge(rows)
    return BatchKVCache.merge(rows)


def is_batch_kv(cache: Any) -> bool:
    """Whether ``cache`` is a layer's batch cache that rolls back per row (``spec.rollback``)."""
    return type(cache) in (BatchKVCache, QuantizedBatchKVCache)


def bits_of(cache: list[Any]) -> int:
    """The bits of a sequence's cache (0: full precision)."""
    return int(getattr(cache[0], "bits", 0)) if cache else 0


def layer_arrays(layer: Any) -> list[mx.array]:
    """The arrays of one layer's held positions: keys, values, or the three arrays of each."""
    keys, values = layer.keys_and_values()
    if isinstance(keys, tuple):
        return [*keys, *values]
    return [keys, values]


def prefix_copy(layer: Any, length: int) -> Any:
    """A new cache holding the first ``length`` positions of ``layer`` (never modified)."""
    if isinstance(layer, QuantizedKVCache):
        copy = QuantizedKVCache(group_size=layer.group_size, bits=layer.bits)
        copy.keys = tuple(a[..., :length, :] for a in layer.keys)
        copy.values = tuple(a[..., :length, :] for a in layer.values)
    else:
        copy = KVCache()
        copy.keys, copy.values = layer.keys[..., :length, :], layer.values[..., :length, :]
    copy.offset = length
    return copy


def from_arrays(arrays: list[mx.array], length: int, bits: int) -> list[Any]:
    """Layers rebuilt from ``layer_arrays`` lists laid end to end, each holding ``length``
    positions. Raises ``ValueError`` when the count of arrays does not fit ``bits``."""
    per = 6 if bits else 2
    if len(arrays) % per:
        raise ValueError(f"{len(arrays)} arrays are not whole layers of {per}")
    layers: list[Any] = []
    for i in range(0, len(arrays), per):
        if bits:
            packed = arrays[i]
            dim = packed.shape[-1] * 32 // bits
            c: Any = QuantizedKVCache(group_size=dim // arrays[i + 1].shape[-1], bits=bits)
            c.keys, c.values = tuple(arrays[i : i + 3]), tuple(arrays[i + 3 : i + 6])
        else:
            c = KVCache()
            c.keys, c.values = arrays[i], arrays[i + 1]
        c.offset = length
        layers.append(c)
    return layers
