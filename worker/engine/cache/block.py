"""The disk tier's block file: one prompt-cache entry's KV for one rank's layers, self-checking.

Layout (little-endian)::

    MAGIC (8 bytes) | version u16 | header length u32 | header (msgspec JSON) | payload | blake2b-256 of all before

The header names what the block is for — the model's identity, the rank's layer range
``[start, end)``, the tenant (docs/architecture.md "Prompt cache disk tier"), the tokens
the KV holds — and each array's dtype, shape and byte count; the payload is the arrays'
bytes, in order (per layer: keys, then values). A block is loaded only when every check
passes: magic, version, lengths, checksum, then identity, layers and tenant equal to the
reader's; otherwise ``BlockError`` says why (the tier deletes the file and logs it).

``encode`` reads evaluated MLX arrays through the buffer protocol only (no MLX operation),
so it may run on a background thread while the engine computes.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import msgspec

MAGIC = b"EXOKVBLK"
VERSION = 1
"""Bumped whenever the layout or the header's meaning changes: other versions are deleted."""
_FIXED = struct.Struct("<8sHI")
_SUM = 32
MAX_HEADER_BYTES = 16 << 20
"""A header longer than this is refused (a corrupt length must not make us allocate it)."""


class BlockError(ValueError):
    """A block that must not be loaded; ``reason`` is one of "truncated", "magic", "version",
    "checksum", "header", "model", "layers", "tenant" (what the log line says)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class ArraySpec(msgspec.Struct, frozen=True):
    """One array of the payload: its MLX dtype name, shape and bytes."""

    dtype: str
    shape: tuple[int, ...]
    nbytes: int


class BlockHeader(msgspec.Struct, frozen=True):
    """What a block holds: ``identity`` (the model, ``identity.model_identity``), ``layers``
    ``(start, end)``, ``tenant`` ("" without API keys), ``tokens`` the KV holds, ``arrays``."""

    identity: str
    layers: tuple[int, int]
    tenant: str
    tokens: tuple[int, ...]
    arrays: tuple[ArraySpec, ...]


def _dtype_name(array: Any) -> str:
    return str(array.dtype).removeprefix("mlx.core.")


def encode(header_of: tuple[str, tuple[int, int], str, tuple[int, ...]], arrays: list[Any]) -> bytes:
    """The block file's bytes for ``arrays`` (evaluated MLX arrays) and ``header_of``
    ``(identity, layers, tenant, tokens)``."""
    datas = [memoryview(a).tobytes() for a in arrays]
    specs = tuple(ArraySpec(_dtype_name(a), tuple(int(s) for s in a.shape), len(d)) for a, d in zip(arrays, datas))
    identity, layers, tenant, tokens = header_of
    head = msgspec.json.encode(BlockHeader(identity, layers, tenant, tokens, specs))
    body = b"".join([_FIXED.pack(MAGIC, VERSION, len(head)), head, *datas])
    return body + hashlib.blake2b(body, digest_size=_SUM).digest()


def read_header(prefix: bytes) -> BlockHeader:
    """The header of a block from its first bytes (at least the fixed part and the header);
    ``BlockError`` for a wrong magic or version, a truncated or unreadable header."""
    if len(prefix) < _FIXED.size:
        raise BlockError("truncated", f"{len(prefix)} bytes")
    magic, version, length = _FIXED.unpack_from(prefix)
    if magic != MAGIC:
        raise BlockError("magic")
    if version != VERSION:
        raise BlockError("version", f"version {version}, this node reads {VERSION}")
    if length > MAX_HEADER_BYTES or len(prefix) < _FIXED.size + length:
        raise BlockError("truncated", f"header of {length} bytes")
    try:
        return msgspec.json.decode(prefix[_FIXED.size:_FIXED.size + length], type=BlockHeader)
    except msgspec.DecodeError as e:
        raise BlockError("header", str(e)) from None


def header_span(prefix: bytes) -> int:
    """Bytes of the fixed part and the header (``read_header`` must have passed)."""
    return _FIXED.size + _FIXED.unpack_from(prefix)[2]


def check_owner(header: BlockHeader, identity: str, layers: tuple[int, int], tenant: str) -> None:
    """``BlockError`` unless the block was written for this model, layer range and tenant."""
    if header.identity != identity:
        raise BlockError("model", f"written for {header.identity[:16]}…")
    if tuple(header.layers) != tuple(layers):
        raise BlockError("layers", f"layers {tuple(header.layers)}, this rank holds {tuple(layers)}")
    if header.tenant != tenant:
        raise BlockError("tenant")


def decode(data: bytes, identity: str, layers: tuple[int, int], tenant: str) -> tuple[BlockHeader, list[Any]]:
    """The header and MLX arrays of a whole block file's ``data`` when every check passes
    (module docstring), else ``BlockError``."""
    import mlx.core as mx
    import numpy as np

    header = read_header(data)
    start = header_span(data)
    need = start + sum(s.nbytes for s in header.arrays) + _SUM
    if len(data) != need:
        raise BlockError("truncated", f"{len(data)} bytes, the header says {need}")
    if hashlib.blake2b(data[:-_SUM], digest_size=_SUM).digest() != data[-_SUM:]:
        raise BlockError("checksum")
    check_owner(header, identity, layers, tenant)
    arrays, at = [], start
    for spec in header.arrays:
        dtype = getattr(mx, spec.dtype, None)
        if not isinstance(dtype, mx.Dtype) or dtype.size * int(np.prod(spec.shape)) != spec.nbytes:
            raise BlockError("header", f"array {spec.dtype} {spec.shape} of {spec.nbytes} bytes")
        raw = np.frombuffer(data, dtype=np.dtype(f"u{dtype.size}"), count=spec.nbytes // dtype.size, offset=at)
        arrays.append(mx.array(raw).view(dtype).reshape(spec.shape))
        at += spec.nbytes
    return header, arrays
