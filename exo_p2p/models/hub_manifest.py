"""A hub repo's manifest and model card, read without its weights (docs/models.md#models-from-a-hub).

``resolve_hub_model`` reads, through a ``HubClient``: the file list at a commit, every small
file whole (``config.json``, tokenizer files, the safetensors index: what is not a
``model*.safetensors`` file), and of each ``model*.safetensors`` file its 8-byte header length
and its JSON header (two range requests). From those it builds what a copy on disk would
give: the model card (``card.card_from_config``) and the manifest (``manifest.chunk_bounds``
cut at the header's end and every tensor's start and end), with one difference: a chunk of
weight bytes has no hash yet (``sha256 == ""``, ``UNKNOWN``) — the hub publishes one SHA-256
per file, not per range. The same commit gives the same manifest (and digest) on every node.

Integrity of such chunks: each range answer must come from the pinned commit and LFS object
(``HubClient``), and every weight file a node completes is checked against its LFS SHA-256
(``check_complete_files``): a mismatch deletes the file's chunks, to be fetched again.

Files taken: ``config.json``, ``model*.safetensors`` and ``model.safetensors.index.json``,
and the tokenizer and generation files (``SMALL_FILES``); nothing else of the repo (READMEs,
other weight formats) is fetched. Bounds: a safetensors header ≤ ``MAX_HEADER_BYTES``, the
small files ≤ ``MAX_SMALL_BYTES`` together.
"""

from __future__ import annotations

import fnmatch
import hashlib
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec

from exo_p2p.models.capabilities import template_capabilities, template_of
from exo_p2p.models.card import card_from_config, float32_sizes
from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.model_json import model_json
from exo_p2p.models.hub import HubClient, HubError, HubFile
from exo_p2p.models.manifest import choose_chunk_bytes, chunk_bounds, tensor_ranges
from exo_p2p.models.partial import PartialModel
from exo_p2p.types.manifest import Chunk, ManifestFile, ModelManifest
from exo_p2p.types.models import HubSource, ModelCard

UNKNOWN = ""
"""The hash of a chunk whose bytes no node has read yet (module docstring)."""
SMALL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "tokenizer.model", "special_tokens_map.json", "added_tokens.json", "vocab.json",
               "merges.txt", "chat_template.jinja", "chat_template.json", "*.tiktoken",
               "model.safetensors.index.json")
WEIGHTS = "model*.safetensors"
MAX_HEADER_BYTES = 100 * 1024 * 1024
MAX_SMALL_BYTES = 256 * 1024 * 1024
RESOLVE_STREAMS = 8
"""Requests in flight at once while resolving (the small files and the headers)."""


def wanted_files(files: list[HubFile]) -> tuple[list[HubFile], list[HubFile]]:
    """``(small files, weight files)`` of a repo listing, each sorted by path. Raises
    ``UnsupportedModelError`` when it is no MLX-format model (no config or no weights)."""
    small = [f for f in files if "/" not in f.path and any(fnmatch.fnmatch(f.path, p) for p in SMALL_FILES)]
    weights = [f for f in files if "/" not in f.path and fnmatch.fnmatch(f.path, WEIGHTS)]
    if not any(f.path == "config.json" for f in small) or not weights:
        raise UnsupportedModelError("the repo is not an MLX-format model: it needs config.json and "
                                    "model*.safetensors (look for an mlx-community/ version of it)")
    return sorted(small, key=lambda f: f.path), sorted(weights, key=lambda f: f.path)


def _header(client: HubClient, f: HubFile) -> tuple[bytes, dict]:
    """The raw header bytes ``[0, 8 + n)`` of a safetensors file and its parsed JSON."""
    raw = client.get_range(f.path, 0, 8)
    (n,) = struct.unpack("<Q", raw)
    if n > MAX_HEADER_BYTES or 8 + n > f.size:
        raise UnsupportedModelError(f"{f.path}: safetensors header of {n} bytes in a {f.size}-byte file")
    raw += client.get_range(f.path, 8, 8 + n)
    return raw, model_json(raw[8:], f"{f.path}: safetensors header")


def _chunks(size: int, cuts: list[int], chunk_bytes: int, known: bytes) -> tuple[Chunk, ...]:
    """Chunks of a file: hashed where ``known`` (the file's first bytes) covers them."""
    out = []
    for start, end in chunk_bounds(size, cuts, chunk_bytes):
        digest = hashlib.sha256(known[start:end]).hexdigest() if end <= len(known) else UNKNOWN
        out.append(Chunk(start, end, digest))
    return tuple(out)


def _weight_entry(path: str, size: int, raw: bytes, header: dict, chunk_bytes: int) -> ManifestFile:
    base = len(raw)
    tensors = tensor_ranges(path, header, base, size)
    cuts = [base, *(t.start for t in tensors), *(t.end for t in tensors)]
    return ManifestFile(path, size, _chunks(size, cuts, chunk_bytes, raw), header_end=base, tensors=tensors)


def resolve_hub_model(client: HubClient, model_id: str,
                      room: Callable[[int], None] | None = None) -> tuple[HubSource, ModelCard, ModelManifest, dict[str, bytes]]:
    """``(source, card, manifest, known bytes)`` of ``client``'s repo (module docstring);
    known bytes: path -> the small files whole and each weight file's header (its first
    bytes). Blocking (a few requests, ``RESOLVE_STREAMS`` at once). ``room(n)`` is called with
    the small files' bytes before any is read (``disk_room.check_room``: it raises
    ``DiskFullError`` when the node has no room to keep them). Raises ``HubError`` (the hub),
    ``UnsupportedModelError`` (not an MLX-format model, a bad header or config)."""
    commit, files = client.info()
    small, weights = wanted_files(files)
    if sum(f.size for f in small) > MAX_SMALL_BYTES:
        raise UnsupportedModelError(f"model {model_id}'s config and tokenizer files exceed {MAX_SMALL_BYTES} bytes")
    if room is not None:
        room(sum(f.size for f in small))
    chunk_bytes = choose_chunk_bytes(sum(f.size for f in small + weights))
    with ThreadPoolExecutor(max_workers=RESOLVE_STREAMS, thread_name_prefix="hub-resolve") as pool:
        # every small file and every header at once, as snapshot_download fetches files
        smalls = [pool.submit(client.get_range, f.path, 0, f.size) for f in small]
        headers = [pool.submit(_header, client, f) for f in weights]
        known = {f.path: got.result() for f, got in zip(small, smalls)}
        read = [got.result() for got in headers]
    entries = [ManifestFile(f.path, f.size, _chunks(f.size, [], chunk_bytes, known[f.path])) for f in small]
    sizes: dict[str, int] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for f, (raw, header) in zip(weights, read):
        known[f.path] = raw
        entries.append(_weight_entry(f.path, f.size, raw, header, chunk_bytes))
        for name, info in header.items():
            if name != "__metadata__":
                sizes[name] = int(info["data_offsets"][1]) - int(info["data_offsets"][0])
                shapes[name] = tuple(int(d) for d in info["shape"])
    try:
        config = model_json(known["config.json"], f"model {model_id}: config.json")
        card = card_from_config(config, sizes, model_id, float32=float32_sizes(config, shapes))
        template = template_of(known.get("chat_template.jinja"), known.get("tokenizer_config.json"))
        card = msgspec.structs.replace(card, capabilities=template_capabilities(template))
    except (ValueError, KeyError, TypeError) as e:
        raise UnsupportedModelError(f"model {model_id}: unusable config.json ({e})") from e
    manifest = ModelManifest(model_id, chunk_bytes, tuple(sorted(entries, key=lambda e: e.path)))
    return HubSource(client.repo_id, commit, manifest.digest), card, manifest, known


def store_known(partial: PartialModel, known: dict[str, bytes]) -> int:
    """Write into ``partial`` every chunk that ``known`` (path -> a file's first bytes) covers
    and whose hash the manifest names; the bytes written (chunks held already count 0)."""
    written = 0
    for entry in partial.manifest.files:
        data = known.get(entry.path, b"")
        for i, c in enumerate(entry.chunks):
            if c.sha256 != UNKNOWN and c.end <= len(data) and partial.write_chunk(entry.path, i, data[c.start:c.end]):
                written += c.end - c.start
    return written


def check_complete_files(partial: PartialModel, file_sha256: dict[str, str],
                         hash_of: Callable[[str], str] | None = None) -> list[str]:
    """Hash every complete file of ``partial`` that has unhashed chunks against its LFS
    SHA-256 (``file_sha256``: path -> hex); a file that differs is discarded
    (``PartialModel.discard_file``: fetched again later). ``hash_of(path)``: the file's hex
    SHA-256 if already known (``hub_hashing.ArrivalHashes.file_sha256``), else it is read.
    The discarded paths. Blocking."""
    bad = []
    for entry in partial.manifest.files:
        expected = file_sha256.get(entry.path)
        target = Path(partial.root) / entry.path
        if not expected or not target.is_file() or all(c.sha256 != UNKNOWN for c in entry.chunks):
            continue
        if partial.file_checked(entry.path):
            continue
        got = hash_of(entry.path) if hash_of is not None else ""
        if not got:
            h = hashlib.sha256()
            with open(target, "rb") as f:
                while block := f.read(1 << 20):
                    h.update(block)
            got = h.hexdigest()
        if got != expected:
            partial.discard_file(entry.path)
            bad.append(entry.path)
        else:
            partial.mark_checked(entry.path)
    return bad


def hub_error_status(exc: Exception) -> int:
    """The HTTP status for a failed resolution: 400 not an MLX-format model, 502 the hub
    not reached or failing, 507 no room on the node's disk for the model's files
    (``disk_room.DiskFullError``, or a write that failed with ``ENOSPC``), 404 otherwise (a
    missing, gated or private repo or revision)."""
    from exo_p2p.models.disk_room import DiskFullError, is_disk_full

    if isinstance(exc, DiskFullError) or is_disk_full(exc):
        return 507
    if isinstance(exc, UnsupportedModelError):
        return 400
    text = str(exc)
    if isinstance(exc, HubError) and ("cannot reach" in text or "answered" in text or "not received" in text):
        return 502
    return 404


def hub_error_text(exc: Exception) -> str:
    """The line a user sees for a failed resolution."""
    from exo_p2p.models.disk_room import DiskFullError

    if isinstance(exc, (HubError, UnsupportedModelError, DiskFullError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
