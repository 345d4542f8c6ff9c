"""A model's manifest: its identity on the wire (docs/models.md; rules in ``exo_p2p.models.manifest``).

A model is a name plus a manifest: every file of its directory with its size, its chunks
(byte ranges with their SHA-256), and for a ``.safetensors`` file the byte range of its header
and of every tensor. The manifest's ``digest`` is the model's identity: two nodes with
different files under one name hold two different models.
"""

from __future__ import annotations

import hashlib

import msgspec


class TensorRange(msgspec.Struct, frozen=True, array_like=True):
    """One tensor's bytes in its file: ``[start, end)``, absolute file offsets in bytes."""

    name: str
    start: int
    end: int


class Chunk(msgspec.Struct, frozen=True, array_like=True):
    """Bytes ``[start, end)`` of a file and their hex SHA-256: the unit of transfer and of
    verification."""

    start: int
    end: int
    sha256: str


class ManifestFile(msgspec.Struct, frozen=True):
    """One file of a model directory.

    ``path`` is relative to the model directory (``/``-separated); ``size`` in bytes;
    ``chunks`` tile ``[0, size)`` in order (an empty file has none), none longer than the
    manifest's ``chunk_bytes`` and none crossing a tensor boundary (so a shard fetches its
    tensors' bytes exactly). For a safetensors file ``header_end`` is the end of its header
    (8-byte length + JSON) and ``tensors`` the range of each tensor; both are empty / 0 for
    other files.
    """

    path: str
    size: int
    chunks: tuple[Chunk, ...]
    header_end: int = 0
    tensors: tuple[TensorRange, ...] = ()


class ModelManifest(msgspec.Struct, frozen=True):
    """Every file of a model (sorted by path) and the largest chunk (bytes)."""

    name: str
    chunk_bytes: int
    files: tuple[ManifestFile, ...]

    @property
    def digest(self) -> str:
        """The model's identity: hex SHA-256 of the canonical JSON of its files and chunk size
        (the name is not part of it: the same bytes under two names are one model)."""
        body = msgspec.json.encode((self.chunk_bytes, self.files))
        return hashlib.sha256(body).hexdigest()

    @property
    def total_bytes(self) -> int:
        """Bytes of every file together."""
        return sum(f.size for f in self.files)

    def file(self, path: str) -> ManifestFile:
        """The entry of ``path``; raises ``KeyError`` for a path the manifest does not list."""
        for f in self.files:
            if f.path == path:
                return f
        raise KeyError(path)


class HeldModel(msgspec.Struct, frozen=True, array_like=True):
    """A model a node holds, as its profile publishes it: ``name``, manifest ``digest``, and
    ``complete`` (False: only some chunks, e.g. one shard fetched from peers)."""

    name: str
    digest: str
    complete: bool = True
