"""The chunk sender: generated chunks travel to the API node that holds the request over a
direct stream, one queue and one sending task per destination, in order, batched.

Rule (``take_batch``): a batch holds the chunks queued now, ``CHUNK_BATCH_MAX`` at most and
``CHUNK_BATCH_BYTES`` of payload at most (the chunk that would pass it starts the next); it is
tried ``CHUNK_ATTEMPTS`` times, then its chunks are counted lost (``chunks_lost``; the API
node's chunk router notices the gap by the stream positions, ``exo_p2p.chunks.order``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import structlog
import trio

from exo_p2p import defaults
from exo_p2p.cluster.common import Counters
from exo_p2p.cluster.messages import CHUNKS_PROTOCOL, ChunkBatch, chunk_batch_decoder, encode
from exo_p2p.types import PROTOCOL_VERSION, Chunk

log = structlog.get_logger(__name__)

Positioned = tuple[Chunk, int]
"""A chunk and its position in its task's stream."""


def chunk_bytes(chunk: Chunk) -> int:
    """The payload bytes ``chunk`` adds to a batch, for ``take_batch``'s byte bound: its
    vectors (an ``EmbeddingChunk``), its image (an ``ImageChunk``'s PNG), text and tokens,
    plus 1 KiB for the rest."""
    return (1024 + len(getattr(chunk, "vectors", b"")) + len(getattr(chunk, "image", b"") or b"")
            + 4 * len(getattr(chunk, "text", "") or ""))


def take_batch(first: Positioned, receive: trio.MemoryReceiveChannel[Positioned], limit: int,
               max_bytes: int = defaults.CHUNK_BATCH_BYTES) -> tuple[list[Positioned], Positioned | None]:
    """``(batch, carry)``: ``first`` and what else is queued now, ``limit`` chunks and
    ``max_bytes`` of ``chunk_bytes`` at most (``first`` always, however large); ``carry`` is the
    chunk taken that would have passed ``max_bytes`` (the next batch's first), else None."""
    batch, size = [first], chunk_bytes(first[0])
    while len(batch) < limit:
        try:
            item = receive.receive_nowait()
        except trio.WouldBlock:
            break
        size += chunk_bytes(item[0])
        if size > max_bytes:
            return batch, item
        batch.append(item)
    return batch, None


class ChunkSender:
    """``send`` (never blocks), ``run()`` (owns the sending tasks), ``serve`` (the
    ``CHUNKS_PROTOCOL`` handler, handing received chunks to ``on_chunks(peer, chunks, positions)``)."""

    def __init__(self, net, counters: Counters,  # type: ignore[no-untyped-def]
                 on_chunks: Callable[[str, list[Chunk], list[int]], None] | None) -> None:
        self.net, self.counters, self.on_chunks = net, counters, on_chunks
        self.queues: dict[str, trio.MemorySendChannel[Positioned]] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await trio.sleep_forever()

    def send(self, destination: str, chunk: Chunk, seq: int) -> None:
        """Queue ``chunk``, position ``seq`` of its task's stream, for ``destination``."""
        queue = self.queues.get(destination)
        if queue is None:
            assert self._nursery is not None, "ChunkSender.run has not started"
            send, receive = trio.open_memory_channel[Positioned](math.inf)
            self.queues[destination] = queue = send
            self._nursery.start_soon(self._sender, destination, receive)
        queue.send_nowait((chunk, seq))

    async def _deliver(self, destination: str, batch: list[Positioned]) -> bool:
        message = encode(ChunkBatch(tuple(c for c, _ in batch), tuple(s for _, s in batch)))
        for attempt in range(defaults.CHUNK_ATTEMPTS):
            try:
                await self.net.request(destination, CHUNKS_PROTOCOL, message, timeout=defaults.CHUNK_REQUEST_TIMEOUT)
                return True
            except Exception as exc:  # noqa: BLE001 - retried, then counted lost
                log.warning("chunk delivery failed", destination=destination, attempt=attempt, error=repr(exc))
                await trio.sleep(defaults.CHUNK_RETRY_PAUSE)
        return False

    async def _sender(self, destination: str, receive: trio.MemoryReceiveChannel[Positioned]) -> None:
        carry: Positioned | None = None
        while True:
            batch, carry = take_batch(carry or await receive.receive(), receive, defaults.CHUNK_BATCH_MAX)
            if not await self._deliver(destination, batch):
                self.counters.add("chunks_lost", len(batch))

    async def serve(self, peer: str, data: bytes) -> bytes:
        batch = chunk_batch_decoder.decode(data)
        if batch.version != PROTOCOL_VERSION:
            raise ValueError(f"unsupported protocol version {batch.version}")
        if self.on_chunks is not None:
            self.on_chunks(peer, list(batch.chunks), list(batch.seqs))
        return b"ok"
