"""Manifests of model directories: building, checking and caching them (docs/models.md).

Verification design (what every transfer relies on): a file is cut into chunks of at most
the manifest's ``chunk_bytes``; in a safetensors file the cuts also fall on the header's end
and on every tensor's start and end, so no chunk holds bytes of two tensors. The manifest
lists each chunk's byte range and SHA-256. A receiver checks each chunk on arrival against
that list, alone, so a transfer can resume chunk by chunk, take chunks from several peers, and
pin a bad chunk on its sender. The manifest itself is trusted by its digest
(``ModelManifest.digest``), which is what placement and the profiles name; a manifest fetched
from a peer is accepted only when its digest is the one asked for.

Which chunks a pipeline rank needs, and sums over chunk sets: ``exo_p2p.models.transfer.chunk_sets``.

Pure functions apart from ``build_manifest`` (reads the files once; ``cached_manifest``
keeps the result next to the data, keyed by every file's path, size and mtime).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from collections.abc import Iterable
from pathlib import Path

import msgspec

from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.model_json import model_json
from exo_p2p.models.names import check_relative_path
from exo_p2p.types.manifest import Chunk, ManifestFile, ModelManifest, TensorRange

MIN_CHUNK_BYTES = 64 * 1024
MAX_CHUNK_BYTES = 8 * 1024 * 1024
"""Chunk size bounds (bytes; a tensor smaller than the chunk size is one shorter chunk). 8 MiB: one request/response frame per chunk keeps a stream's
reader busy (a Yamux stream idle ~5 s is reset) and loses little work on a resume."""
TARGET_CHUNKS = 512
"""``choose_chunk_bytes`` aims at about this many chunks per model (fine-grained shards on
small models, few requests on large ones)."""

EXCLUDED_NAMES = frozenset({".exo-import.json"})
"""Files that describe where a local copy came from, not the model (never in a manifest)."""

_SHA256_RE = re.compile(r"[0-9a-f]{64}")


def choose_chunk_bytes(total_bytes: int) -> int:
    """A power of two in ``[MIN_CHUNK_BYTES, MAX_CHUNK_BYTES]`` near ``total / TARGET_CHUNKS``."""
    want = max(1, total_bytes // TARGET_CHUNKS)
    size = MIN_CHUNK_BYTES
    while size < want and size < MAX_CHUNK_BYTES:
        size *= 2
    return size


def model_files(model_dir: Path) -> list[Path]:
    """Regular files under ``model_dir`` that belong to the model, sorted by relative path:
    no hidden files or directories, no :data:`EXCLUDED_NAMES`, no ``*.part`` leftovers."""
    out = []
    for path in sorted(model_dir.rglob("*")):
        rel = path.relative_to(model_dir)
        if any(part.startswith(".") for part in rel.parts) or path.name in EXCLUDED_NAMES:
            continue
        if path.suffix == ".part" or not path.is_file():
            continue
        out.append(path)
    return out


def safetensors_layout(path: Path) -> tuple[int, tuple[TensorRange, ...]]:
    """``(header_end, tensors)`` of a safetensors file: absolute byte ranges, sorted by start.

    Raises:
        UnsupportedModelError: a truncated or non-JSON header, or a tensor outside the file.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise UnsupportedModelError(f"{path}: truncated safetensors header")
        (length,) = struct.unpack("<Q", raw)
        if 8 + length > size:
            raise UnsupportedModelError(f"{path}: safetensors header longer than the file")
        data = f.read(length)
    header = model_json(data, f"{path}: safetensors header")
    base = 8 + length
    return base, tensor_ranges(path, header, base, size)


def tensor_ranges(path: str, header: dict, base: int, size: int) -> tuple[TensorRange, ...]:
    """The byte ranges of a safetensors file's tensors from its ``header`` (``base``: where
    the data starts, ``size``: the file's bytes), ordered by offset. Raises
    ``UnsupportedModelError`` for a tensor outside the file."""
    ranges = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = (base + int(o) for o in info["data_offsets"])
        if not base <= start <= end <= size:
            raise UnsupportedModelError(f"{path}: tensor {name} lies outside the file")
        ranges.append(TensorRange(name, start, end))
    ranges.sort(key=lambda t: (t.start, t.name))
    return tuple(ranges)


def chunk_bounds(size: int, cuts: Iterable[int], chunk_bytes: int) -> list[tuple[int, int]]:
    """``[start, end)`` ranges tiling ``[0, size)``: cut at every offset of ``cuts`` and
    then every ``chunk_bytes`` within each piece (pure)."""
    points = sorted({0, size, *(c for c in cuts if 0 < c < size)})
    out = []
    for a, b in zip(points, points[1:]):
        for start in range(a, b, chunk_bytes):
            out.append((start, min(b, start + chunk_bytes)))
    return out


def hash_chunks(path: Path, bounds: list[tuple[int, int]]) -> tuple[Chunk, ...]:
    """The ``Chunk`` (range + hex SHA-256) of each range of ``bounds`` in ``path``."""
    out = []
    with open(path, "rb") as f:
        for start, end in bounds:
            f.seek(start)
            out.append(Chunk(start, end, hashlib.sha256(f.read(end - start)).hexdigest()))
    return tuple(out)


def build_manifest(model_dir: Path, name: str, chunk_bytes: int | None = None) -> ModelManifest:
    """The manifest of ``model_dir`` (reads every byte once to hash it).

    ``chunk_bytes`` defaults to ``choose_chunk_bytes`` of the directory's total size.

    Raises:
        UnsupportedModelError: an unreadable safetensors header (``safetensors_layout``).
    """
    files = model_files(model_dir)
    if chunk_bytes is None:
        chunk_bytes = choose_chunk_bytes(sum(p.stat().st_size for p in files))
    entries = []
    for path in files:
        header_end, tensors = (safetensors_layout(path) if path.suffix == ".safetensors"
                               else (0, ()))
        size = path.stat().st_size
        cuts = [header_end, *(t.start for t in tensors), *(t.end for t in tensors)]
        entries.append(ManifestFile(
            path=path.relative_to(model_dir).as_posix(),
            size=size,
            chunks=hash_chunks(path, chunk_bounds(size, cuts, chunk_bytes)),
            header_end=header_end,
            tensors=tensors,
        ))
    return ModelManifest(name=name, chunk_bytes=chunk_bytes, files=tuple(entries))


def check_manifest(manifest: ModelManifest) -> ModelManifest:
    """``manifest`` unchanged when it is shaped as ``build_manifest`` makes them; a manifest
    from a peer is checked before any of its paths or ranges touches the disk (its digest
    only proves it is the one asked for, not that it is sane).

    Rules: ``chunk_bytes`` in ``[1, MAX_CHUNK_BYTES]``; every file path safe and relative
    (``exo_p2p.models.names.check_relative_path``), not ending in ``.part``, listed once,
    and no path a directory of another; a file's chunks tile ``[0, size)`` in order, each
    non-empty, at most ``chunk_bytes`` long, with a lower-case hex SHA-256 (or "": a hub chunk
    no node has read yet, ``exo_p2p.models.hub.manifest``); ``header_end``
    within the file; tensors within ``[header_end, size]``, sorted and not overlapping.

    Raises:
        ValueError: the first rule broken, naming the file.
    """
    if not 0 < manifest.chunk_bytes <= MAX_CHUNK_BYTES:
        raise ValueError(f"manifest chunk size {manifest.chunk_bytes} outside [1, {MAX_CHUNK_BYTES}]")
    paths = {f.path for f in manifest.files}
    if len(paths) != len(manifest.files):
        raise ValueError("manifest lists a file twice")
    for f in manifest.files:
        check_relative_path(f.path, "manifest file path")
        if f.path.endswith(".part"):
            raise ValueError(f"manifest file path {f.path!r} ends in .part")
        parents = f.path.split("/")[:-1]
        for i in range(1, len(parents) + 1):
            if "/".join(parents[:i]) in paths:
                raise ValueError(f"manifest lists {'/'.join(parents[:i])!r} as a file and a directory")
        if f.size < 0:
            raise ValueError(f"{f.path}: negative size {f.size}")
        at = 0
        for i, c in enumerate(f.chunks):
            if c.start != at or not c.start < c.end <= f.size or c.end - c.start > manifest.chunk_bytes:
                raise ValueError(f"{f.path}: chunk {i} [{c.start}, {c.end}) does not continue the "
                                 f"chunks at {at} within {f.size} bytes and {manifest.chunk_bytes} per chunk")
            if c.sha256 and not _SHA256_RE.fullmatch(c.sha256):  # "": a hub chunk not read yet
                raise ValueError(f"{f.path}: chunk {i} has no hex SHA-256")
            at = c.end
        if at != f.size:
            raise ValueError(f"{f.path}: chunks cover {at} of {f.size} bytes")
        if not 0 <= f.header_end <= f.size:
            raise ValueError(f"{f.path}: header end {f.header_end} outside the file")
        at = f.header_end
        for t in f.tensors:
            if not at <= t.start <= t.end <= f.size:
                raise ValueError(f"{f.path}: tensor {t.name} [{t.start}, {t.end}) overlaps another, "
                                 f"the header, or runs past the file ({f.size} bytes)")
            at = t.end
    return manifest


def _stamp(model_dir: Path) -> list[list]:
    return [[p.relative_to(model_dir).as_posix(), p.stat().st_size, p.stat().st_mtime_ns]
            for p in model_files(model_dir)]


def cached_manifest(model_dir: Path, name: str, cache_dir: Path) -> ModelManifest:
    """``build_manifest(model_dir, name)``, reusing the copy in ``cache_dir`` while every
    file's path, size and mtime are unchanged (one JSON file per model name).

    Raises: as ``build_manifest``."""
    cache = cache_dir / f"{name.replace('/', '--')}.manifest.json"  # HF repo ids have a slash
    stamp = _stamp(model_dir)
    try:
        saved = json.loads(cache.read_text())
        if saved["stamp"] == stamp:
            return msgspec.convert(saved["manifest"], ModelManifest)
    except (OSError, ValueError, KeyError, TypeError, msgspec.ValidationError):
        pass
    manifest = build_manifest(model_dir, name)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_bytes(msgspec.json.encode({"stamp": stamp, "manifest": manifest}))
    os.replace(tmp, cache)
    return manifest


def seed_cached_manifest(model_dir: Path, manifest: ModelManifest, cache_dir: Path) -> None:
    """Record ``manifest`` as ``model_dir``'s in ``cache_dir`` (what ``cached_manifest`` reads
    while the files are unchanged), for a copy whose chunk hashes were computed as its bytes
    arrived (``exo_p2p.models.hub.hashing``): the node does not hash it all again. The caller
    vouches that it equals ``build_manifest(model_dir, manifest.name)``."""
    cache = cache_dir / f"{manifest.name.replace('/', '--')}.manifest.json"
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_bytes(msgspec.json.encode({"stamp": _stamp(model_dir), "manifest": manifest}))
    os.replace(tmp, cache)


def chunk_span(manifest: ModelManifest, path: str, index: int) -> tuple[int, int]:
    """``[start, end)`` bytes of chunk ``index`` of ``path``. Raises ``KeyError`` (unknown
    path) or ``IndexError`` (no such chunk)."""
    entry = manifest.file(path)
    if not 0 <= index < len(entry.chunks):
        raise IndexError(f"{path} has no chunk {index}")
    chunk = entry.chunks[index]
    return chunk.start, chunk.end


class ChunkVerificationError(ValueError):
    """A chunk's bytes do not match the manifest's hash (or length); nothing was written."""


def verify_chunk(manifest: ModelManifest, path: str, index: int, data: bytes) -> tuple[int, int]:
    """``[start, end)`` of chunk ``index`` of ``path`` once ``data`` is checked against the
    manifest: its length, then its SHA-256 (a chunk with hash "" came from a hub and has
    none yet: ``exo_p2p.models.hub.manifest``).

    Raises:
        ChunkVerificationError: wrong length or hash.
        KeyError / IndexError: a path or chunk the manifest does not list (``chunk_span``).
    """
    start, end = chunk_span(manifest, path, index)
    if len(data) != end - start:
        raise ChunkVerificationError(
            f"chunk {index} of {path}: {len(data)} bytes, expected {end - start}")
    expected = manifest.file(path).chunks[index].sha256
    if expected and hashlib.sha256(data).hexdigest() != expected:  # "": from a hub, no hash yet
        raise ChunkVerificationError(f"chunk {index} of {path}: hash mismatch")
    return start, end
