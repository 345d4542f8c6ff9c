"""The bulk path for model chunks: plain TCP, opened by a one-time ticket issued over libp2p.

Why: libp2p 0.8.1's stream stack (Noise + Yamux, framed in Python) carries about a fifth of
what a plain TCP socket carries on the same machine (``scripts/bench_transfer.py``); a home
cluster moving tens of GB would wait hours. So the bytes travel on a TCP connection, and the
cluster's authenticated channel decides who may open one:

1. the fetching node asks the holder for a ticket over ``TICKET_PROTOCOL`` (a libp2p
   request/response: Noise-authenticated, and PSK-private when the cluster has a secret);
   the holder answers ``BulkTicket(port, token)``: 32 random bytes, valid for one connection,
   bound to the asking peer and one manifest digest, expiring after ``TICKET_TTL`` seconds;
2. the fetcher connects to the holder's IP (from its libp2p address) at ``port`` and sends the
   token first; a connection with an unknown, used or expired token is closed at once;
3. on that connection it sends chunk requests (4-byte big-endian length + msgpack
   ``ChunkRequest`` of the ticket's digest) and reads replies (1 status byte, 8-byte length,
   then the chunk bytes, or a UTF-8 error message when the status is not 0), one at a time.

Integrity does not rest on the TCP path: every chunk is checked against the manifest's hash
on arrival (``PartialModel.write_chunk``), whatever path carried it. The bytes are not
encrypted on this path (they are the model's weights, which the manifest names anyway).
Bounds: a connection silent for ``IDLE_TIMEOUT`` seconds between requests is closed; at most
``MAX_CONNECTIONS`` bulk connections are served at once (more are closed on arrival); a reply
announcing more than ``MAX_CHUNK_BYTES`` (no chunk or error message is longer) fails that
request before a byte of it is read, so a hostile holder cannot make the fetcher buffer
without bound.
"""

from __future__ import annotations

import secrets
import struct
import time
from collections.abc import Callable

import msgspec
import structlog
import trio

from exo_p2p.models.manifest import MAX_CHUNK_BYTES
from exo_p2p.models.peer_transfer import ChunkRequest, ChunkSource

log = structlog.get_logger(__name__)

TICKET_PROTOCOL = "/exo-p2p/model-bulk-ticket/1"
TOKEN_BYTES = 32
TICKET_TTL = 30.0
IDLE_TIMEOUT = 60.0
MAX_CONNECTIONS = 16
_LEN = struct.Struct(">I")
_REPLY = struct.Struct(">BQ")
MAX_REQUEST_BYTES = 64 * 1024


class BulkTicket(msgspec.Struct, frozen=True, array_like=True):
    """A one-time permission to open a bulk connection: TCP ``port`` and ``token`` (bytes)."""

    port: int
    token: bytes


class BulkError(RuntimeError):
    """The bulk connection failed or the holder refused a chunk (message says why)."""


async def _receive_exactly(stream: trio.abc.ReceiveStream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        part = await stream.receive_some(min(n - len(buf), 4 << 20))
        if not part:
            raise BulkError(f"connection closed after {len(buf)} of {n} bytes")
        buf += part
    return bytes(buf)


class BulkServer:
    """Serves chunks of ``sources(digest)`` on a TCP port to holders of a valid ticket.

    ``register(net)`` serves ``TICKET_PROTOCOL``; ``run(listen_host)`` (in a nursery) accepts
    connections; ``port`` is known once ``run`` has started (``nursery.start``).
    """

    def __init__(self, sources: Callable[[str], ChunkSource | None], *, clock: Callable[[], float] = time.monotonic) -> None:
        self._sources = sources
        self._clock = clock
        self._tickets: dict[bytes, tuple[str, str, float]] = {}  # token -> (peer, digest, expiry)
        self._open = 0
        self.port = 0
        self.bytes_served = 0

    def register(self, net) -> None:  # type: ignore[no-untyped-def]
        net.set_request_handler(TICKET_PROTOCOL, self.serve_ticket)

    def issue(self, peer: str, digest: str) -> BulkTicket:
        """A new ticket for ``peer`` to fetch ``digest``. Raises ``LookupError`` when the model
        is not held here, ``RuntimeError`` before ``run`` has started."""
        if not self.port:
            raise RuntimeError("bulk server is not listening")
        if self._sources(digest) is None:
            raise LookupError(f"model {digest[:12]} is not held by this node")
        now = self._clock()
        self._tickets = {t: v for t, v in self._tickets.items() if v[2] > now}
        token = secrets.token_bytes(TOKEN_BYTES)
        self._tickets[token] = (peer, digest, now + TICKET_TTL)
        return BulkTicket(self.port, token)

    async def serve_ticket(self, peer: str, data: bytes) -> bytes:
        return msgspec.msgpack.encode(self.issue(peer, data.decode()))

    def redeem(self, token: bytes) -> str | None:
        """The digest ``token`` was issued for (and forget the token), None when unknown or
        expired."""
        entry = self._tickets.pop(token, None)
        if entry is None or entry[2] <= self._clock():
            return None
        return entry[1]

    async def run(self, listen_host: str, *, task_status=trio.TASK_STATUS_IGNORED) -> None:  # type: ignore[no-untyped-def]
        listeners = await trio.open_tcp_listeners(0, host=listen_host)
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        if self._open >= MAX_CONNECTIONS:
            await stream.aclose()
            return
        self._open += 1
        try:
            with trio.move_on_after(5.0):
                token = await _receive_exactly(stream, TOKEN_BYTES)
                digest = self.redeem(token)
            if digest is None:
                return
            source = self._sources(digest)
            while source is not None:
                with trio.move_on_after(IDLE_TIMEOUT) as idle:
                    (length,) = _LEN.unpack(await _receive_exactly(stream, _LEN.size))
                    if length > MAX_REQUEST_BYTES:
                        return
                    request = msgspec.msgpack.decode(await _receive_exactly(stream, length), type=ChunkRequest)
                if idle.cancelled_caught:
                    return
                try:
                    if request.digest != digest:
                        raise LookupError("the ticket is for another model")
                    chunk = await trio.to_thread.run_sync(source.read_chunk, request.path, request.index)
                except Exception as exc:  # the fetcher moves to another holder
                    message = str(exc).encode()
                    await stream.send_all(_REPLY.pack(1, len(message)) + message)
                    continue
                await stream.send_all(_REPLY.pack(0, len(chunk)))
                await stream.send_all(chunk)
                self.bytes_served += len(chunk)
        except (BulkError, trio.BrokenResourceError, trio.ClosedResourceError, msgspec.DecodeError,
                msgspec.ValidationError, OSError) as exc:
            log.debug("bulk connection ended", error=repr(exc))
        finally:
            self._open -= 1
            await stream.aclose()


class BulkConnection:
    """One open bulk connection to a holder (one request at a time)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream

    @classmethod
    async def open(cls, host: str, ticket: BulkTicket) -> BulkConnection:
        stream = await trio.open_tcp_stream(host, ticket.port)
        await stream.send_all(ticket.token)
        return cls(stream)

    async def get(self, request: ChunkRequest) -> bytes:
        """The chunk bytes; raises ``BulkError`` (refused, the connection broke, or a reply
        longer than any chunk announced)."""
        body = msgspec.msgpack.encode(request)
        try:
            await self.stream.send_all(_LEN.pack(len(body)) + body)
            status, length = _REPLY.unpack(await _receive_exactly(self.stream, _REPLY.size))
            if length > MAX_CHUNK_BYTES:
                raise BulkError(f"the holder announced a {length}-byte reply, more than a chunk "
                                f"({MAX_CHUNK_BYTES} bytes)")
            data = await _receive_exactly(self.stream, length)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise BulkError(f"bulk connection broke: {exc!r}") from exc
        if status != 0:
            raise BulkError(data.decode(errors="replace"))
        return data

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(1.0):
            await self.stream.aclose()


def ip_of_peer(addrs: list[str]) -> str | None:
    """The first IPv4 address among libp2p multiaddrs ``/ip4/A/tcp/P/...``; None if none."""
    for addr in addrs:
        parts = addr.split("/")
        if len(parts) > 2 and parts[1] == "ip4":
            return parts[2]
    return None


def bulk_chunk_getter(net, digest: str, *, timeout: float):  # type: ignore[no-untyped-def]
    """A ``exo_p2p.models.fetch.GetChunk`` over the bulk path: per peer, a pool of idle
    connections (at most one per concurrent request, i.e. the fetcher's streams per peer);
    a connection that failed is closed, never reused. Returns ``(get_chunk, aclose)``.
    Ticket requests are bounded by ``timeout`` seconds."""
    idle: dict[str, list[BulkConnection]] = {}

    async def get_chunk(peer: str, path: str, index: int) -> bytes:
        pool = idle.setdefault(peer, [])
        conn = pool.pop() if pool else None
        if conn is None:
            host = ip_of_peer(net.peer_addrs(peer))
            if host is None:
                raise BulkError(f"no IPv4 address known for {peer}")
            reply = await net.request(peer, TICKET_PROTOCOL, digest.encode(), timeout=timeout)
            ticket = msgspec.msgpack.decode(reply, type=BulkTicket)
            with trio.fail_after(timeout):
                conn = await BulkConnection.open(host, ticket)
        try:
            data = await conn.get(ChunkRequest(digest, path, index))
        except BaseException:
            await conn.aclose()
            raise
        pool.append(conn)
        return data

    async def aclose() -> None:
        for pool in idle.values():
            for conn in pool:
                await conn.aclose()
        idle.clear()

    return get_chunk, aclose
