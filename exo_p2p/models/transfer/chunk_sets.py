"""Which chunks of a manifest a shard needs, and sums over chunk sets (docs/models.md).

A chunk set is a mapping ``path -> chunk indices`` of one manifest. Which chunks a pipeline
rank needs (``shard_chunks``): every chunk of every file that is not a safetensors file
(config, tokenizer, generation config, templates), the header of each safetensors file, and
the chunks of the tensors of its layers ``[start, end)``, plus the embedding
(``embed_tokens``) on rank 0, and on the last rank the final norm and every other non-layer
tensor and the head (``lm_head``, or the embedding when tied). Since chunks never cross a
tensor boundary (``exo_p2p.models.manifest``), a rank fetches exactly its tensors' bytes.

Pure functions.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Mapping, Sequence

from exo_p2p.models.manifest import chunk_span
from exo_p2p.types import Instance, ShardMetadata
from exo_p2p.types.manifest import Chunk, ModelManifest

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_EMBEDDING_RE = re.compile(r"(?:^|\.)embed_tokens\.")
_HEAD_RE = re.compile(r"(?:^|\.)lm_head\.")


def _chunks_of_range(chunks: Sequence[Chunk], start: int, end: int) -> list[int]:
    """Indices of the chunks overlapping ``[start, end)`` (chunks sorted by start)."""
    first = bisect.bisect_right([c.end for c in chunks], start)
    out = []
    for i in range(first, len(chunks)):
        if chunks[i].start >= end:
            break
        out.append(i)
    return out


def tensor_wanted(name: str, *, start_layer: int, end_layer: int, n_layers: int, tied: bool) -> bool:
    """Whether the pipeline rank holding layers ``[start_layer, end_layer)`` of ``n_layers``
    loads tensor ``name`` (rule: module docstring)."""
    first, last = start_layer == 0, end_layer == n_layers
    if m := _LAYER_RE.search(name):
        return start_layer <= int(m.group(1)) < end_layer
    if _EMBEDDING_RE.search(name):
        return first or (last and tied)
    if _HEAD_RE.search(name):
        return last
    return last


def shard_chunks(
    manifest: ModelManifest, *, start_layer: int, end_layer: int, n_layers: int, tied: bool
) -> dict[str, tuple[int, ...]]:
    """File path -> sorted chunk indices a pipeline rank with layers ``[start_layer,
    end_layer)`` needs (rule: module docstring). ``start_layer=0, end_layer=n_layers``
    gives every chunk of every file. Files with no needed chunk are left out.

    Raises ``ValueError`` for a layer range outside ``[0, n_layers]`` or empty."""
    if not 0 <= start_layer < end_layer <= n_layers:
        raise ValueError(f"bad layer range [{start_layer}, {end_layer}) of {n_layers} layers")
    out: dict[str, tuple[int, ...]] = {}
    for entry in manifest.files:
        if not entry.tensors and entry.header_end == 0:
            wanted = set(range(len(entry.chunks)))
        else:
            wanted = set(_chunks_of_range(entry.chunks, 0, entry.header_end))
            for t in entry.tensors:
                if tensor_wanted(t.name, start_layer=start_layer, end_layer=end_layer,
                                 n_layers=n_layers, tied=tied):
                    wanted.update(_chunks_of_range(entry.chunks, t.start, t.end))
        if wanted:
            out[entry.path] = tuple(sorted(wanted))
    return out


def all_chunks(manifest: ModelManifest) -> dict[str, tuple[int, ...]]:
    """Every chunk of every (non-empty) file: what a whole-model pull fetches."""
    return {f.path: tuple(range(len(f.chunks))) for f in manifest.files if f.chunks}


def chunk_bytes_of(manifest: ModelManifest, chunks: Mapping[str, Iterable[int]]) -> int:
    """Total bytes of the given chunks (``path -> indices``)."""
    total = 0
    for path, indices in chunks.items():
        for i in indices:
            start, end = chunk_span(manifest, path, i)
            total += end - start
    return total


def missing_chunks(
    wanted: Mapping[str, Iterable[int]], held: Mapping[str, Iterable[int]]
) -> dict[str, tuple[int, ...]]:
    """``wanted`` minus ``held`` (both ``path -> chunk indices``); files left with nothing to
    fetch are dropped."""
    out = {}
    for path, indices in wanted.items():
        have = set(held.get(path, ()))
        rest = tuple(i for i in indices if i not in have)
        if rest:
            out[path] = rest
    return out


def wanted_chunks(manifest: ModelManifest, instance: Instance, shard: ShardMetadata, *, tied: bool) -> dict[str, tuple[int, ...]]:
    """File path -> chunk indices the rank ``shard`` of ``instance`` reads: every chunk for a
    single or a tensor-parallel rank (it slices every tensor), else ``shard_chunks`` of its
    layers (rule: ``exo_p2p.models.depot.shard_fetch``). ``tied``: the model's head is its
    embedding (``ModelCard.tie_word_embeddings``). Pure."""
    if instance.sharding == "tensor" or shard.world_size == 1:
        return all_chunks(manifest)
    return shard_chunks(manifest, start_layer=shard.start_layer, end_layer=shard.end_layer,
                        n_layers=shard.n_layers, tied=tied)
