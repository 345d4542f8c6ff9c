"""``QuantizedBatchKVCache``: mlx-lm's left-padded ``BatchKVCache`` with quantized keys and values.

Layout and rules are those of ``mlx_lm.models.cache.BatchKVCache`` (row ``i`` is left-padded
by ``left_padding[i]`` positions, which the mask hides; ``offset[i]`` is its RoPE offset; one
shared write index ``_idx``; the buffer grows by ``step`` positions), but each of ``keys`` and
``values`` is the triple ``mx.quantize`` returns — packed ``uint32`` words ``[B, H, L, D ×
bits / 32]``, scales and biases ``[B, H, L, D / group_size]`` — as in mlx-lm's one-sequence
``QuantizedKVCache``. A position's quantization only depends on its own vector, so every row
operation (pad, roll, slice, gather) is applied to the three arrays alike. The model's
attention sees ``bits`` and ``group_size`` on the cache and takes mlx-lm's quantized
scaled-dot-product path (``mlx_lm.models.base.scaled_dot_product_attention``).

Only the new positions a forward pass writes exist at full precision, for one layer at a
time (``update_and_fetch`` quantizes them before storing).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import QuantizedKVCache, dynamic_roll

Triple = tuple[mx.array, mx.array, mx.array]


def _zeros(rows: int, heads: int, length: int, dim: int, dtype: Any, bits: int, group: int) -> Triple:
    """An all-zero quantized buffer of ``length`` positions (packed words, scales, biases)."""
    return (mx.zeros((rows, heads, length, dim * bits // 32), dtype=mx.uint32),
            mx.zeros((rows, heads, length, dim // group), dtype=dtype),
            mx.zeros((rows, heads, length, dim // group), dtype=dtype))


def _map(triple: Triple, fn: Any) -> Triple:
    return (fn(triple[0]), fn(triple[1]), fn(triple[2]))


class QuantizedBatchKVCache:
    """One layer's KV of a batch of left-padded rows, quantized (module docstring).

    ``left_padding``: each row's padding (positions); ``bits``: 8 or 4; ``group_size``:
    elements per scale (``exo_p2p.models.kv_bytes.group_size``)."""

    step = 256

    def __init__(self, left_padding: list[int], group_size: int = 64, bits: int = 8) -> None:
        self.keys: Triple | None = None
        self.values: Triple | None = None
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-p for p in left_padding])
        self._idx = 0
        self._right_padding: mx.array | None = None
        self.group_size, self.bits = group_size, bits

    def _dims(self) -> tuple[int, int]:
        """(key dim, value dim) in elements."""
        assert self.keys is not None and self.values is not None
        return self.keys[0].shape[-1] * 32 // self.bits, self.values[0].shape[-1] * 32 // self.bits

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Triple, Triple]:
        """Store ``keys``/``values`` ``[B, H, n, D]`` (full precision) quantized after every
        row's last position; returns every position's keys and values (quantized)."""
        prev, n = self._idx, keys.shape[2]
        if self.keys is None or prev + n > self.keys[0].shape[2]:
            B, H = keys.shape[:2]
            grow = (self.step + n - 1) // self.step * self.step
            new_k = _zeros(B, H, grow, keys.shape[3], keys.dtype, self.bits, self.group_size)
            new_v = _zeros(B, H, grow, values.shape[3], values.dtype, self.bits, self.group_size)
            if self.keys is None or self.values is None:
                self.keys, self.values = new_k, new_v
            else:
                if prev % self.step != 0:
                    self.keys = _map(self.keys, lambda x: x[..., :prev, :])
                    self.values = _map(self.values, lambda x: x[..., :prev, :])
                self.keys = tuple(mx.concatenate([a, b], axis=2) for a, b in zip(self.keys, new_k))  # type: ignore[assignment]
                self.values = tuple(mx.concatenate([a, b], axis=2) for a, b in zip(self.values, new_v))  # type: ignore[assignment]
        self.offset = self.offset + n
        self._idx += n
        qk = mx.quantize(keys, group_size=self.group_size, bits=self.bits)
        qv = mx.quantize(values, group_size=self.group_size, bits=self.bits)
        assert self.keys is not None and self.values is not None
        for i in range(3):
            self.keys[i][..., prev : self._idx, :] = qk[i]
            self.values[i][..., prev : self._idx, :] = qv[i]
        return self.keys_and_values()

    def keys_and_values(self) -> tuple[Triple, Triple]:
        assert self.keys is not None and self.values is not None
        return _map(self.keys, lambda x: x[..., : self._idx, :]), _map(self.values, lambda x: x[..., : self._idx, :])

    def prepare(self, *, left_padding: list[int] | None = None, lengths: Any = None,
                right_padding: list[int] | None = None) -> None:
        """As ``BatchKVCache.prepare``: more left padding (empty cache only) or the right
        padding of the next forward, rolled to the left by ``finalize``."""
        if left_padding is not None:
            if self.keys is not None:
                raise ValueError("left padding can only be added to an empty QuantizedBatchKVCache")
            pad = mx.array(left_padding)
            self.left_padding += pad
            self.offset = self.offset - pad
        if right_padding is not None and max(right_padding) > 0:
            self._right_padding = mx.array(right_padding)

    def finalize(self) -> None:
        """Roll each row's right padding to its left (``prepare``)."""
        if self._right_padding is not None and self.keys is not None and self.values is not None:
            shift = self._right_padding[:, None]
            self.keys = _map(self.keys, lambda x: dynamic_roll(x, shift, axis=2))
            self.values = _map(self.values, lambda x: dynamic_roll(x, shift, axis=2))
            self.offset = self.offset - self._right_padding
            self.left_padding += self._right_padding
        self._right_padding = None

    @property
    def state(self) -> tuple[Any, ...]:
        return self.keys, self.values, self.offset, self.left_padding, self._idx

    @state.setter
    def state(self, v: tuple[Any, ...]) -> None:
        self.keys, self.values, self.offset, self.left_padding, self._idx = v

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        """Drop the last ``n`` positions of every row (the shared write index moves back)."""
        n = min(self._idx, n)
        self._idx -= n
        self.offset = self.offset - n
        return n

    def make_mask(self, N: int, return_array: bool = False, **kwargs: Any) -> mx.array:
        return create_causal_mask(N, offset=self._idx, left_padding=self.left_padding, **kwargs)

    def filter(self, batch_indices: mx.array) -> None:
        """Keep rows ``batch_indices`` (in that order); padding all rows share is cut."""
        if self.keys is not None and self.values is not None:
            self.keys = _map(self.keys, lambda x: x[batch_indices])
            self.values = _map(self.values, lambda x: x[batch_indices])
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        cut = min(self.left_padding.tolist())
        if cut > 0:
            if self.keys is not None and self.values is not None:
                self.keys = _map(self.keys, lambda x: x[..., cut:, :])
                self.values = _map(self.values, lambda x: x[..., cut:, :])
            self._idx -= cut
            self.left_padding -= cut

    def extend(self, other: QuantizedBatchKVCache) -> None:
        """Append ``other``'s rows (same bits and group), both right-aligned at the longer
        write index. Raises ``ValueError`` for another quantization."""
        if (other.bits, other.group_size) != (self.bits, self.group_size):
            raise ValueError(f"cannot extend a {self.bits}-bit KV cache with a {other.bits}-bit one")
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        top = max(self._idx, other._idx)
        size = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)
        like = self if self.keys is not None else other
        dims, heads = like._dims(), like.keys[0].shape[1]  # type: ignore[index]
        dtype = like.keys[1].dtype  # type: ignore[index]
        parts = [c._aligned(top, size, heads, dims, dtype) for c in (self, other)]
        self.keys = tuple(mx.concatenate([parts[0][0][i], parts[1][0][i]]) for i in range(3))  # type: ignore[assignment]
        self.values = tuple(mx.concatenate([parts[0][1][i], parts[1][1][i]]) for i in range(3))  # type: ignore[assignment]
        self.offset = mx.concatenate([self.offset, other.offset])
        self.left_padding = mx.concatenate([parts[0][2], parts[1][2]])
        self._idx = top

    def _aligned(self, top: int, size: int, heads: int, dims: tuple[int, int], dtype: Any) -> tuple[Triple, Triple, mx.array]:
        """This cache's keys, values and left padding, padded so its write index is at
        ``top`` of a buffer of ``size`` positions."""
        rows = self.offset.shape[0]
        k = self.keys or _zeros(rows, heads, 0, dims[0], dtype, self.bits, self.group_size)
        v = self.values or _zeros(rows, heads, 0, dims[1], dtype, self.bits, self.group_size)
        left = top - self._idx
        right = size - k[0].shape[2] - left
        if right < 0:
            k, v = _map(k, lambda x: x[..., :right, :]), _map(v, lambda x: x[..., :right, :])
            right = 0
        if left or right:
            widths = [(0, 0), (0, 0), (left, right), (0, 0)]
            k, v = _map(k, lambda x: mx.pad(x, widths)), _map(v, lambda x: mx.pad(x, widths))
        return k, v, self.left_padding + left

    def extract(self, idx: int) -> QuantizedKVCache:
        """Row ``idx`` as one sequence's ``QuantizedKVCache`` (padding removed)."""
        cache = QuantizedKVCache(group_size=self.group_size, bits=self.bits)
        pad = int(self.left_padding[idx].item())
        if self.keys is not None and self.values is not None:
            cache.keys = _map(self.keys, lambda x: mx.contiguous(x[idx : idx + 1, :, pad : self._idx]))
            cache.values = _map(self.values, lambda x: mx.contiguous(x[idx : idx + 1, :, pad : self._idx]))
            cache.offset = self._idx - pad
        return cache

    @classmethod
    def merge(cls, caches: list[QuantizedKVCache]) -> QuantizedBatchKVCache:
        """One row per sequence cache in ``caches`` (all of one quantization), left-padded to
        the longest. Raises ``ValueError`` for mixed quantizations or none."""
        if not caches:
            raise ValueError("nothing to merge")
        bits, group = caches[0].bits, caches[0].group_size
        if any((c.bits, c.group_size) != (bits, group) for c in caches):
            raise ValueError("cannot merge KV caches of different quantizations")
        lengths = [c.offset if c.keys is not None else 0 for c in caches]
        longest = max(lengths)
        padding = [longest - n for n in lengths]
        cache = cls(padding, group_size=group, bits=bits)
        if longest == 0:
            return cache
        full = next(c for c in caches if c.keys is not None)
        heads, dtype = full.keys[0].shape[1], full.keys[1].dtype
        dk, dv = full.keys[0].shape[-1] * 32 // bits, full.values[0].shape[-1] * 32 // bits
        keys = _zeros(len(caches), heads, longest, dk, dtype, bits, group)
        values = _zeros(len(caches), heads, longest, dv, dtype, bits, group)
        for i, (p, c) in enumerate(zip(padding, caches)):
            if c.keys is None:
                continue
            for j in range(3):
                keys[j][i : i + 1, :, p:] = c.keys[j][..., : c.offset, :]
                values[j][i : i + 1, :, p:] = c.values[j][..., : c.offset, :]
        cache.keys, cache.values = keys, values
        cache.offset = cache.offset + longest
        cache._idx = longest
        return cache

    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return sum(int(a.nbytes) for a in (*self.keys, *self.values))
