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
small files ≤ ``MAX_SMALL_BYTES`` together, and every number of the repo checked before it
sizes anything (``hub_limits``: listing, per-kind small-file caps, weight sizes against their
headers, chunk count, layers); a small file is read by a range of its listed (capped) size,
so a server sending more is cut there.
"""

from __future__ import annotations

import fnmatch
import hashlib
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec

from exo_p2p.models.card.capabilities import model_capabilities, template_of
from exo_p2p.models.card.derive import card_from_config, float32_sizes
from exo_p2p.models.copies.disk_room import DiskFullError, is_disk_full
from exo_p2p.models.copies.partial import PartialModel
from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.hub.client import HubClient, HubError, HubFile
from exo_p2p.models.hub.stop import HubTimeout, Stop
from exo_p2p.models.hub_limits import (FILE_DEADLINE, HeaderBudget, check_chunks, check_listed_sizes, check_weight_size,
                                       chunk_count)
from exo_p2p.models.manifest import choose_chunk_bytes, chunk_bounds, tensor_ranges
from exo_p2p.models.model_json import model_json
from exo_p2p.types.manifest import Chunk, ManifestFile, ModelManifest
from exo_p2p.types.models import HubSource, ModelCard

UNKNOWN = ""
"""The hash of a chunk whose bytes no node has read yet (module docstring)."""
SMALL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "tokenizer.model", "special_tokens_map.json", "added_tokens.json", "vocab.json",
               "merges.txt", "chat_template.jinja", "chat_template.json", "*.tiktoken",
               "model.safetensors.index.json")
WEIGHTS = "model*.safetensors"
MAX_HEADER_BYTES = 4 * 1024 * 1024
"""Bytes of one safetensors JSON header at most (real ones are well under 1 MB; all of a
repo's together: ``hub_limits.MAX_HEADERS_BYTES``)."""
MAX_SMALL_BYTES = 256 * 1024 * 1024
"""Bytes of the small files together at most (each is capped by kind: ``hub_limits``)."""
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


def _header(client: HubClient, f: HubFile, stop: Stop | None = None,
            budget: HeaderBudget | None = None) -> tuple[bytes, dict]:
    """The raw header bytes ``[0, 8 + n)`` of a safetensors file and its parsed JSON, checked
    against the file's listed size (``hub_limits.check_weight_size``) before it is used."""
    raw = client.get_range(f.path, 0, 8, stop)
    (n,) = struct.unpack("<Q", raw)
    if n > MAX_HEADER_BYTES or 8 + n > f.size:
        raise UnsupportedModelError(f"{f.path}: safetensors header of {n} bytes in a {f.size}-byte file "
                                    f"(the limit is {MAX_HEADER_BYTES} bytes, MAX_HEADER_BYTES)")
    if budget is not None:
        budget.take(f.path, n)
    buf = bytearray(raw)  # one copy of the header in memory while it arrives
    client.stream_range(f.path, 8, 8 + n, buf.extend, stop)
    raw = bytes(buf)
    del buf
    header = model_json(raw[8:], f"{f.path}: safetensors header")
    if not isinstance(header, dict):
        raise UnsupportedModelError(f"{f.path}: safetensors header is not a JSON object")
    check_weight_size(f.path, f.size, len(raw), header)
    return raw, header


def _chunks(size: int, cuts: list[int], chunk_bytes: int, known: bytes) -> tuple[Chunk, ...]:
    """Chunks of a file: hashed where ``known`` (the file's first bytes) covers them."""
    out = []
    for start, end in chunk_bounds(size, cuts, chunk_bytes):
        digest = hashlib.sha256(known[start:end]).hexdigest() if end <= len(known) else UNKNOWN
        out.append(Chunk(start, end, digest))
    return tuple(out)


def _read_all(client: HubClient, small: list[HubFile], weights: list[HubFile], model_id: str,
              stop: Stop | None) -> tuple[dict[str, bytes], list[tuple[bytes, dict]]]:
    """Every small file whole and every weight file's header, ``RESOLVE_STREAMS`` at once, each
    under its own deadline (``FILE_DEADLINE``, within ``stop``'s)."""
    def each(f: HubFile) -> Stop | None:
        return stop.for_file(FILE_DEADLINE, f"reading {f.path} of model {model_id}") if stop is not None else None

    with ThreadPoolExecutor(max_workers=RESOLVE_STREAMS, thread_name_prefix="hub-resolve") as pool:
        # every small file and every header at once, as snapshot_download fetches files
        smalls = [pool.submit(client.get_range, f.path, 0, f.size, each(f)) for f in small]
        budget = HeaderBudget()
        headers = [pool.submit(_header, client, f, each(f), budget) for f in weights]
        try:
            return ({f.path: got.result() for f, got in zip(small, smalls)}, [got.result() for got in headers])
        except BaseException:
            if stop is not None:
                stop.set()  # one failed: the others stop at their next block
            raise


def resolve_hub_model(client: HubClient, model_id: str, stop: Stop | None = None
                      ) -> tuple[HubSource, ModelCard, ModelManifest, dict[str, bytes]]:
    """``(source, card, manifest, known bytes)`` of ``client``'s repo (module docstring);
    known bytes: path -> the small files whole and each weight file's header (its first
    bytes). Every number from the repo is checked before it sizes anything (``hub_limits``).
    Blocking (a few requests, ``RESOLVE_STREAMS`` at once). Raises ``HubError`` (the hub),
    ``UnsupportedModelError`` (not an MLX-format model, a bad header or config, a bound
    passed), ``HubStopped`` / ``HubTimeout`` (``stop`` set or its deadline passed)."""
    commit, files = client.info(stop)
    small, weights = wanted_files(files)
    check_listed_sizes([(f.path, f.size) for f in small], [(f.path, f.size) for f in weights])
    if sum(f.size for f in small) > MAX_SMALL_BYTES:
        raise UnsupportedModelError(f"model {model_id}'s config and tokenizer files exceed {MAX_SMALL_BYTES} bytes")
    chunk_bytes = choose_chunk_bytes(sum(f.size for f in small + weights))
    known, read = _read_all(client, small, weights, model_id, stop)
    layouts = []
    for f, (raw, header) in zip(weights, read):
        known[f.path] = raw
        tensors = tensor_ranges(f.path, header, len(raw), f.size)
        layouts.append((f, tensors, [len(raw), *(t.start for t in tensors), *(t.end for t in tensors)]))
    check_chunks(sum(chunk_count(f.size, [], chunk_bytes) for f in small)
                 + sum(chunk_count(f.size, cuts, chunk_bytes) for f, _, cuts in layouts))
    entries = [ManifestFile(f.path, f.size, _chunks(f.size, [], chunk_bytes, known[f.path])) for f in small]
    entries += [ManifestFile(f.path, f.size, _chunks(f.size, cuts, chunk_bytes, known[f.path]),
                             header_end=len(known[f.path]), tensors=tensors) for f, tensors, cuts in layouts]
    try:
        config = model_json(known["config.json"], f"model {model_id}: config.json")
        sizes = {n: int(i["data_offsets"][1]) - int(i["data_offsets"][0]) for _, h in read for n, i in h.items() if n != "__metadata__"}
        shapes = {n: tuple(int(d) for d in i["shape"]) for _, h in read for n, i in h.items() if n != "__metadata__"}
        card = card_from_config(config, sizes, model_id, float32=float32_sizes(config, shapes))
        template = template_of(known.get("chat_template.jinja"), known.get("tokenizer_config.json"))
        card = msgspec.structs.replace(card, capabilities=model_capabilities(template, config))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
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
    SHA-256 if already known (``hub.hashing.ArrivalHashes.file_sha256``), else it is read.
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
    """The HTTP status for a failed resolution: 400 not an MLX-format model or past a bound
    (``hub_limits``), 504 past a deadline (``HubTimeout``), 502 the hub not reached or
    failing, 507 no room on the node's disk for the model's files (``disk_room.DiskFullError``,
    or a write that failed with ``ENOSPC``), 404 otherwise (a missing, gated or private repo
    or revision)."""
    if isinstance(exc, DiskFullError) or is_disk_full(exc):
        return 507
    if isinstance(exc, UnsupportedModelError):
        return 400
    if isinstance(exc, HubTimeout):
        return 504
    text = str(exc)
    if isinstance(exc, HubError) and ("cannot reach" in text or "answered" in text or "not received" in text):
        return 502
    return 404


def hub_error_text(exc: Exception) -> str:
    """The line a user sees for a failed resolution."""
    if isinstance(exc, (HubError, UnsupportedModelError, HubTimeout, DiskFullError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
