"""Bounds on what a model repository on a hub may make a node spend (docs/security.md).

A hub repo is untrusted input: anyone can publish one, and a mirror or a plain-HTTP
``HF_ENDPOINT`` can lie. Every number read from it is checked here *before* anything is
sized by it (a list, a range, a read, a JSON parse): the listing's sibling count and bytes,
each small file's listed size by kind, each weight file's listed size against its
safetensors header, the manifest's chunk count, ``num_hidden_layers`` against the layers the
tensors name. Pure functions; each refusal is an ``UnsupportedModelError`` naming the field,
the value and the limit (the API answers it 400: ``hub.manifest.hub_error_status``).

The time side (a hub that trickles or never answers) is ``exo_p2p.models.hub.resolve``.
"""

from __future__ import annotations

import fnmatch
import threading
from collections.abc import Iterable, Mapping

from exo_p2p.models.errors import UnsupportedModelError

MAX_LISTING_BYTES = 8 * 1024 * 1024
"""Bytes of a repo's listing (``/api/models/…?blobs=true``) read at most; more is refused
before any of it is parsed (10,000 siblings take ~3 MB)."""
MAX_REPO_FILES = 10_000
"""Files (siblings) a repo's listing may name at most."""
MAX_CONFIG_BYTES = 4 * 1024 * 1024
"""Bytes of ``config.json`` and the other small JSON/template files at most (a real one is a
few KB)."""
MAX_TOKENIZER_BYTES = 64 * 1024 * 1024
"""Bytes of one tokenizer file at most (``tokenizer.json``, ``tokenizer.model``,
``vocab.json``, ``merges.txt``, ``*.tiktoken``; the largest real ones are ~35 MB)."""
MAX_INDEX_BYTES = 16 * 1024 * 1024
"""Bytes of ``model.safetensors.index.json`` at most."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt", "*.tiktoken")
"""Small files capped at ``MAX_TOKENIZER_BYTES``; the index at ``MAX_INDEX_BYTES``; every
other small file at ``MAX_CONFIG_BYTES``."""
MAX_WEIGHT_FILE_BYTES = 512 * 1024 ** 3
"""Bytes one listed ``model*.safetensors`` file may have at most (real shards are ≤ ~10 GB)."""
MAX_MODEL_BYTES = 2 * 1024 ** 4
"""Bytes a repo's taken files may have together at most."""
MAX_TENSORS = 50_000
"""Tensors one safetensors header may name at most."""
MAX_WEIGHT_FILES = 2048
"""``model*.safetensors`` files a repo may list at most (the largest real models have ~200)."""
MAX_HEADERS_BYTES = 16 * 1024 * 1024
"""Bytes of all the weight files' safetensors headers of a repo together at most: parsed,
a header takes ~6× its bytes in memory, and all are held until the card is made."""
MAX_CHUNKS = 400_000
"""Chunks a hub model's manifest may have at most (2 TiB in 8 MiB chunks is 262,144, plus
one cut per tensor boundary); counted before any is built."""
MAX_LAYERS = 1024
"""``num_hidden_layers`` at most (the deepest real models have ~128)."""


def _refuse(what: str, value: object, limit: object) -> UnsupportedModelError:
    return UnsupportedModelError(f"{what} is {value}, more than the limit of {limit}")


def small_file_cap(path: str) -> int:
    """The byte cap of small file ``path`` by kind (``TOKENIZER_FILES`` → ``MAX_TOKENIZER_BYTES``,
    the safetensors index → ``MAX_INDEX_BYTES``, else ``MAX_CONFIG_BYTES``). Pure."""
    if path == "model.safetensors.index.json":
        return MAX_INDEX_BYTES
    if any(fnmatch.fnmatch(path, p) for p in TOKENIZER_FILES):
        return MAX_TOKENIZER_BYTES
    return MAX_CONFIG_BYTES


def check_sibling_count(count: int) -> None:
    """Refuse a listing naming more than ``MAX_REPO_FILES`` files."""
    if count > MAX_REPO_FILES:
        raise _refuse("the repo's file count (siblings)", count, MAX_REPO_FILES)


def check_listed_sizes(small: Iterable[tuple[str, int]], weights: Iterable[tuple[str, int]]) -> None:
    """Refuse listed sizes (``(path, bytes)``) beyond their caps: each small file by kind
    (``small_file_cap``), each weight file ``MAX_WEIGHT_FILE_BYTES``, all ``MAX_MODEL_BYTES``;
    a negative size is refused too."""
    weights = list(weights)
    if len(weights) > MAX_WEIGHT_FILES:
        raise _refuse("the repo's count of model*.safetensors files", len(weights), MAX_WEIGHT_FILES)
    total = 0
    for path, size in small:
        if size < 0 or size > small_file_cap(path):
            raise _refuse(f"the listed size of {path}", size, f"{small_file_cap(path)} bytes")
        total += size
    for path, size in weights:
        if size < 0 or size > MAX_WEIGHT_FILE_BYTES:
            raise _refuse(f"the listed size of {path}", size, f"{MAX_WEIGHT_FILE_BYTES} bytes")
        total += size
    if total > MAX_MODEL_BYTES:
        raise _refuse("the listed size of the model's files", total, f"{MAX_MODEL_BYTES} bytes")


class HeaderBudget:
    """Bytes of safetensors headers a resolution may still read (``MAX_HEADERS_BYTES`` in
    all); ``take`` is called from several threads at once."""

    def __init__(self, total: int = MAX_HEADERS_BYTES) -> None:
        self.left, self.total, self._lock = total, total, threading.Lock()

    def take(self, path: str, n: int) -> None:
        """Reserve ``n`` bytes for ``path``'s header. Raises ``UnsupportedModelError`` past the budget."""
        with self._lock:
            if n > self.left:
                raise UnsupportedModelError(f"{path}: the safetensors headers of the repo are more than the limit "
                                            f"of {self.total} bytes together (MAX_HEADERS_BYTES)")
            self.left -= n


def data_end(header: Mapping) -> int:
    """The largest ``data_offsets`` end a safetensors header names (0 for none). Raises
    ``UnsupportedModelError`` for a malformed entry. Pure."""
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            a, b = (int(o) for o in info["data_offsets"])
        except (TypeError, ValueError, KeyError) as e:
            raise UnsupportedModelError(f"tensor {str(name)[:100]}: bad data_offsets ({e})") from e
        if not 0 <= a <= b:
            raise UnsupportedModelError(f"tensor {str(name)[:100]}: data_offsets [{a}, {b}] out of order")
        end = max(end, b)
    return end


def check_weight_size(path: str, listed: int, header_bytes: int, header: Mapping) -> None:
    """Refuse a weight file whose listed size is not what its header says: ``header_bytes``
    (``8 + n``) plus the largest tensor end offset (``data_end``), as a safetensors file is
    laid out; and a header naming more than ``MAX_TENSORS`` tensors."""
    tensors = len(header) - ("__metadata__" in header)
    if tensors > MAX_TENSORS:
        raise _refuse(f"{path}: the safetensors header's tensor count", tensors, MAX_TENSORS)
    expected = header_bytes + data_end(header)
    if expected != listed:
        raise UnsupportedModelError(f"{path}: the listed size {listed} is not the {expected} bytes its "
                                    f"safetensors header gives (header {header_bytes} + data {expected - header_bytes})")


def chunk_count(size: int, cuts: Iterable[int], chunk_bytes: int) -> int:
    """How many ranges ``manifest.chunk_bounds(size, cuts, chunk_bytes)`` gives, computed
    without building them (O(cuts)). Pure."""
    points = sorted({0, size, *(c for c in cuts if 0 < c < size)})
    return sum(-(-(b - a) // chunk_bytes) for a, b in zip(points, points[1:]))


def check_chunks(count: int) -> None:
    """Refuse a manifest of more than ``MAX_CHUNKS`` chunks."""
    if count > MAX_CHUNKS:
        raise _refuse("the manifest's chunk count", count, MAX_CHUNKS)


def check_layers(n_layers: object, layer_indices: Iterable[int]) -> int:
    """``num_hidden_layers`` as an int once it is in ``[1, MAX_LAYERS]`` and no more than the
    distinct layers the tensors name (``layer_indices``): a config cannot make the card size
    a list by a count its weights do not back. Raises ``UnsupportedModelError``."""
    try:
        n = int(n_layers)  # type: ignore[call-overload]
    except (TypeError, ValueError) as e:
        raise UnsupportedModelError(f"num_hidden_layers {str(n_layers)[:50]!r} is not a number") from e
    if not 1 <= n <= MAX_LAYERS:
        raise UnsupportedModelError(f"num_hidden_layers is {n}, outside the limit of 1..{MAX_LAYERS}")
    named = len(set(layer_indices))
    if n > named:
        raise UnsupportedModelError(f"num_hidden_layers is {n} but the weights name tensors of {named} layers")
    return n

# --- time and threads (exo_p2p.models.hub.resolve) ----------------------------------------------
RESOLVE_THREADS = 4
"""Threads reading hubs' listings, small files and headers at once on a node, in their own
limiter (never trio's shared one, which shard fetches, pulls and bulk serving use)."""
RESOLVE_DEADLINE = 60.0
"""Seconds a repo's resolution (listing, small files, headers) may take in all."""
FILE_DEADLINE = 30.0
"""Seconds one file of a resolution (a small file, or a header's two ranges) may take."""
PREVIEW_CACHE = 32
"""Hub models' cards a node keeps for previews at most (not in State: only a placement adds one)."""
PREVIEW_TTL = 300.0
"""Seconds a preview's card read from a hub is reused before it is read again."""
