"""The fetcher's side of the bulk path (protocol and server: ``exo_p2p.models.transfer.bulk``), and
its fall-back to the libp2p stream.

``fetch_getter`` is the ``GetChunk`` a fetch uses: per holder, the bulk path first; when it
fails for a holder — the ticket request fails (an older node, no bulk port), the connection
is refused, closed, stalls or carries a malformed reply — that chunk and every later one
from that holder in this fetch go over the libp2p chunk protocol, and the node logs
``bulk path failed, falling back to the libp2p stream`` once per holder and fetch. A holder's
error answer (``BulkRefused``, e.g. a chunk it lacks) is no failure of the path and is
passed on as it is.

Bounds of the bulk path on this side, so a fall-back leaves most of the fetch's
``chunk_timeout`` to the libp2p stream: ``CONNECT_TIMEOUT`` seconds for the TCP connection
and the token; ``STALL_TIMEOUT`` seconds without a byte while a reply is awaited; a reply
announcing more than ``MAX_CHUNK_BYTES`` fails before a byte of it is read (a hostile holder
cannot make the fetcher buffer without bound).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
import structlog
import trio

from exo_p2p.models.manifest import MAX_CHUNK_BYTES
from exo_p2p.models.transfer.bulk import _LEN, _REPLY, TICKET_PROTOCOL, BulkError, BulkRefused, BulkTicket, _receive_exactly
from exo_p2p.models.transfer.protocols import ChunkRequest

log = structlog.get_logger(__name__)

CONNECT_TIMEOUT = 5.0
"""Seconds to open a bulk TCP connection and send its token."""
STALL_TIMEOUT = 10.0
"""Seconds without a byte, while a reply is awaited, before the connection counts as failed."""
FELL_BACK = "bulk path failed, falling back to the libp2p stream"

GetChunk = Callable[[str, str, int], Awaitable[bytes]]
Closer = Callable[[], Awaitable[None]]


class BulkConnection:
    """One open bulk connection to a holder (one request at a time)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream

    @classmethod
    async def open(cls, host: str, ticket: BulkTicket) -> BulkConnection:
        """Connect to ``host:ticket.port`` and present the token; raises ``BulkError`` when
        refused, broken or slower than ``CONNECT_TIMEOUT`` seconds."""
        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                stream = await trio.open_tcp_stream(host, ticket.port)
                try:
                    await stream.send_all(ticket.token)
                except BaseException:
                    await trio.aclose_forcefully(stream)
                    raise
        except trio.TooSlowError as exc:
            raise BulkError(f"no bulk connection to {host}:{ticket.port} within {CONNECT_TIMEOUT} s") from exc
        except (OSError, trio.BrokenResourceError) as exc:
            raise BulkError(f"bulk connection to {host}:{ticket.port} failed: {exc!r}") from exc
        return cls(stream)

    async def get(self, request: ChunkRequest) -> bytes:
        """The chunk bytes. Raises ``BulkRefused`` (the holder's error answer) or ``BulkError``
        (the connection broke, stalled ``STALL_TIMEOUT`` s, or a reply longer than any chunk
        was announced)."""
        body = msgspec.msgpack.encode(request)
        try:
            await self.stream.send_all(_LEN.pack(len(body)) + body)
            status, length = _REPLY.unpack(await _receive_exactly(self.stream, _REPLY.size, stall=STALL_TIMEOUT))
            if length > MAX_CHUNK_BYTES:
                raise BulkError(f"the holder announced a {length}-byte reply, more than a chunk "
                                f"({MAX_CHUNK_BYTES} bytes)")
            data = await _receive_exactly(self.stream, length, stall=STALL_TIMEOUT)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise BulkError(f"bulk connection broke: {exc!r}") from exc
        if status != 0:
            raise BulkRefused(data.decode(errors="replace"))
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


async def _ticket(net, peer: str, digest: str, timeout: float) -> BulkTicket:  # type: ignore[no-untyped-def]
    """A ticket from ``peer`` for ``digest``; raises ``BulkError`` for any failure of the request."""
    try:
        reply = await net.request(peer, TICKET_PROTOCOL, digest.encode(), timeout=timeout)
        return msgspec.msgpack.decode(reply, type=BulkTicket)
    except Exception as exc:  # no bulk path to this peer (an older node, not listening, ...)
        raise BulkError(f"no bulk ticket: {exc}") from exc


def bulk_chunk_getter(net, digest: str, *, timeout: float) -> tuple[GetChunk, Closer]:  # type: ignore[no-untyped-def]
    """A ``exo_p2p.models.transfer.fetch.GetChunk`` over the bulk path only: per peer, a pool of idle
    connections (at most one per concurrent request, i.e. the fetcher's streams per peer);
    a connection that failed is closed, never reused. Returns ``(get_chunk, aclose)``.
    Ticket requests are bounded by ``timeout`` seconds; every failure raises ``BulkError``."""
    idle: dict[str, list[BulkConnection]] = {}

    async def get_chunk(peer: str, path: str, index: int) -> bytes:
        pool = idle.setdefault(peer, [])
        conn = pool.pop() if pool else None
        if conn is None:
            host = ip_of_peer(net.peer_addrs(peer))
            if host is None:
                raise BulkError(f"no IPv4 address known for {peer}")
            conn = await BulkConnection.open(host, await _ticket(net, peer, digest, timeout))
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


def fetch_getter(net, digest: str, p2p_get: GetChunk, *, timeout: float) -> tuple[GetChunk, Closer]:  # type: ignore[no-untyped-def]
    """The ``GetChunk`` of one fetch: the bulk path, falling back per holder to ``p2p_get``
    (the libp2p chunk protocol) as the module docstring says. Returns ``(get_chunk, aclose)``;
    ``get_chunk`` raises what ``p2p_get`` raises, or ``BulkRefused``."""
    bulk_get, bulk_close = bulk_chunk_getter(net, digest, timeout=timeout)
    no_bulk: set[str] = set()

    async def get_chunk(peer: str, path: str, index: int) -> bytes:
        if peer not in no_bulk:
            try:
                return await bulk_get(peer, path, index)
            except BulkRefused:
                raise
            except BulkError as exc:
                if peer not in no_bulk:
                    no_bulk.add(peer)
                    log.warning(FELL_BACK, peer=peer, path=path, index=index, error=str(exc))
        return await p2p_get(peer, path, index)

    return get_chunk, bulk_close
