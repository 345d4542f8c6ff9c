"""Vision features per image, computed once per image digest (docs/models.md#vision-models).

``FeatureCache`` holds the vision tower's output of recent images (an ``mx.array`` of
``[tokens, hidden]`` per sha256 digest of the image's bytes), least recently used first out,
bounded in entries and in bytes, so a multi-turn chat that re-sends an image encodes it once.
``image_features`` splits a processor's batch of patches by image (Qwen2-VL's
``pixel_values`` are every image's patches end to end, ``image_grid_thw`` each image's
temporal × height × width patch grid) and runs the tower only on the images the cache lacks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import mlx.core as mx

FEATURE_CACHE_ENTRIES = 64
"""Images whose features a runner keeps at most."""
FEATURE_CACHE_BYTES = 256 * 1024 * 1024
"""Bytes of features a runner keeps at most (a 1-megapixel image is ~1,300 tokens of
3,584 float16 values in Qwen2.5-VL-7B: ~9 MiB)."""


class FeatureCache:
    """Vision features by image digest, LRU, at most ``max_entries`` and ``max_bytes``;
    ``hits``/``misses`` count lookups. An entry larger than ``max_bytes`` is not kept."""

    def __init__(self, max_entries: int = FEATURE_CACHE_ENTRIES, max_bytes: int = FEATURE_CACHE_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, mx.array] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of the features held."""
        return self._bytes

    def get(self, digest: str) -> mx.array | None:
        """The features of ``digest`` (marked most recently used), or None."""
        features = self._entries.get(digest)
        if features is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(digest)
        return features

    def put(self, digest: str, features: mx.array) -> None:
        """Keep ``features`` for ``digest``, evicting the least recently used past the bounds."""
        if features.nbytes > self.max_bytes:
            return
        old = self._entries.pop(digest, None)
        if old is not None:
            self._bytes -= old.nbytes
        self._entries[digest] = features
        self._bytes += features.nbytes
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.nbytes


def image_features(tower, pixel_values: mx.array, grid_thw: mx.array, digests: Sequence[str],  # noqa: ANN001 - an mlx-vlm vision tower
                   cache: FeatureCache) -> mx.array:
    """The tower's features of every image, end to end (``[sum of tokens, hidden]``), each
    image's taken from ``cache`` when its digest is there and computed (then kept) otherwise.
    ``digests[i]`` names image ``i`` of ``grid_thw``. Raises ``ValueError`` when they disagree."""
    grids = [tuple(int(v) for v in row) for row in grid_thw.tolist()]
    if len(grids) != len(digests):
        raise ValueError(f"{len(digests)} image digests for {len(grids)} images")
    dtype = tower.patch_embed.proj.weight.dtype
    out, start = [], 0
    for digest, (t, h, w) in zip(digests, grids):
        rows = t * h * w
        features = cache.get(digest)
        if features is None:
            patches = pixel_values[start:start + rows].astype(dtype)
            features = tower(patches, mx.array([[t, h, w]]), output_hidden_states=False)
            mx.eval(features)
            cache.put(digest, features)
        out.append(features)
        start += rows
    return mx.concatenate(out, axis=0)
