"""The model transfer protocols over the cluster's libp2p connections (docs/models.md).

Two request/response protocols on ``exo_p2p.net.Network`` (one stream per request, bounded by
``Network.request``'s timeout and ``max_frame_bytes``, so one chunk of at most
``exo_p2p.models.manifest.MAX_CHUNK_BYTES`` per request):

- ``MANIFEST_PROTOCOL``: request = a manifest digest (hex, UTF-8); reply = the manifest's
  JSON. The requester accepts it only when its digest is the one asked for
  (``fetch_manifest``).
- ``HELD_PROTOCOL``: request = a manifest digest; reply = msgpack ``{path: [chunk index, ...]}``
  of the chunks held (every chunk of a complete copy): a fetch from peers and a hub asks
  the hub only for what no peer holds, without asking each peer chunk by chunk first.
- ``CHUNK_PROTOCOL``: request = ``ChunkRequest`` (msgpack); reply = the chunk's bytes. The
  server answers only from a complete local copy or a verified chunk of a partial one; the
  requester verifies every byte anyway (``PartialModel.write_chunk``).

``ModelServer`` bounds the chunks it reads at once (``max_concurrent``), so many fetching
peers queue instead of filling memory. A fault hook (``corrupt_chunks``, tests only) flips one
bit of the first N chunks it serves.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import msgspec
import structlog
import trio

from exo_p2p.models.manifest import check_manifest, chunk_span
from exo_p2p.types.manifest import ModelManifest

log = structlog.get_logger(__name__)

MANIFEST_PROTOCOL = "/exo-p2p/model-manifest/1"
CHUNK_PROTOCOL = "/exo-p2p/model-chunk/1"
HELD_PROTOCOL = "/exo-p2p/model-held/1"
HOOK_CORRUPT_CHUNKS = "model_corrupt_chunks"
"""``--fault-hook model_corrupt_chunks=N``: the node serves its first N chunks with a bit flipped."""


class ChunkRequest(msgspec.Struct, frozen=True, array_like=True):
    """Chunk ``index`` of file ``path`` of the model whose manifest digest is ``digest``."""

    digest: str
    path: str
    index: int


class ChunkSource(Protocol):
    """What a server reads chunks from: a manifest and its verified chunks."""

    manifest: ModelManifest

    def read_chunk(self, path: str, index: int) -> bytes: ...


class LocalModel:
    """A complete model directory on this node, served chunk by chunk."""

    def __init__(self, model_dir: Path, manifest: ModelManifest) -> None:
        self.model_dir = Path(model_dir)
        self.manifest = manifest

    def read_chunk(self, path: str, index: int) -> bytes:
        """Chunk bytes from the file (``KeyError``/``IndexError`` for what the manifest lacks)."""
        start, end = chunk_span(self.manifest, path, index)
        with open(self.model_dir / path, "rb") as f:
            f.seek(start)
            return f.read(end - start)


class ModelServer:
    """Answers ``MANIFEST_PROTOCOL`` and ``CHUNK_PROTOCOL`` requests from ``sources(digest)``
    (None: not held here; the requester gets a RemoteError saying so)."""

    def __init__(
        self,
        sources: Callable[[str], ChunkSource | None],
        *,
        max_concurrent: int = 8,
        corrupt_chunks: int = 0,
    ) -> None:
        self._sources = sources
        self._limit = trio.Semaphore(max_concurrent)
        self._corrupt_left = corrupt_chunks
        self.chunks_served = 0
        self.bytes_served = 0

    def register(self, net) -> None:  # type: ignore[no-untyped-def]
        """Serve both protocols on ``net`` (an ``exo_p2p.net.Network``)."""
        net.set_request_handler(MANIFEST_PROTOCOL, self.serve_manifest)
        net.set_request_handler(CHUNK_PROTOCOL, self.serve_chunk)
        net.set_request_handler(HELD_PROTOCOL, self.serve_held)

    async def serve_held(self, peer: str, data: bytes) -> bytes:
        source = self._source(data.decode())
        held = getattr(source, "held", None)
        if held is None:  # a complete copy
            return msgspec.msgpack.encode({f.path: list(range(len(f.chunks))) for f in source.manifest.files})
        return msgspec.msgpack.encode(held())

    def _source(self, digest: str) -> ChunkSource:
        source = self._sources(digest)
        if source is None:
            raise LookupError(f"model {digest[:12]} is not held by this node")
        return source

    async def serve_manifest(self, peer: str, data: bytes) -> bytes:
        return msgspec.json.encode(self._source(data.decode()).manifest)

    async def serve_chunk(self, peer: str, data: bytes) -> bytes:
        request = msgspec.msgpack.decode(data, type=ChunkRequest)
        source = self._source(request.digest)
        async with self._limit:
            chunk = await trio.to_thread.run_sync(source.read_chunk, request.path, request.index)
        if self._corrupt_left > 0:
            self._corrupt_left -= 1
            chunk = bytes([chunk[0] ^ 1]) + chunk[1:] if chunk else chunk
            log.warning("fault hook: serving a corrupted chunk", peer=peer, path=request.path,
                        index=request.index)
        self.chunks_served += 1
        self.bytes_served += len(chunk)
        return chunk


async def fetch_manifest(net, peer: str, digest: str, *, timeout: float) -> ModelManifest:  # type: ignore[no-untyped-def]
    """The manifest ``digest`` from ``peer``. Raises ``ValueError`` when the reply is not that
    manifest or not a sane one (``check_manifest``: a peer that hashed unsafe paths or
    overlapping chunks into a manifest gets its digest right), ``msgspec`` errors for a
    malformed reply, and ``exo_p2p.net`` errors when the request fails."""
    reply = await net.request(peer, MANIFEST_PROTOCOL, digest.encode(), timeout=timeout)
    manifest = msgspec.json.decode(reply, type=ModelManifest)
    if manifest.digest != digest:
        raise ValueError(f"{peer} sent manifest {manifest.digest[:12]} for {digest[:12]}")
    try:
        return check_manifest(manifest)
    except ValueError as exc:
        raise ValueError(f"{peer} sent a malformed manifest {digest[:12]}: {exc}") from None


async def fetch_held(net, peer: str, digest: str, *, timeout: float) -> dict[str, tuple[int, ...]]:  # type: ignore[no-untyped-def]
    """The chunks of manifest ``digest`` that ``peer`` holds (``HELD_PROTOCOL``). Raises as
    ``Network.request`` (a node without the protocol too) and ``msgspec`` errors."""
    reply = await net.request(peer, HELD_PROTOCOL, digest.encode(), timeout=timeout)
    return msgspec.msgpack.decode(reply, type=dict[str, tuple[int, ...]])


def chunk_getter(net, digest: str, *, timeout: float):  # type: ignore[no-untyped-def]
    """A ``exo_p2p.models.transfer.fetch.GetChunk`` asking peers over ``CHUNK_PROTOCOL`` (each request
    bounded by ``timeout`` seconds; the fetcher adds its own per-chunk bound)."""

    async def get_chunk(peer: str, path: str, index: int) -> bytes:
        request = msgspec.msgpack.encode(ChunkRequest(digest, path, index))
        return await net.request(peer, CHUNK_PROTOCOL, request, timeout=timeout)

    return get_chunk
