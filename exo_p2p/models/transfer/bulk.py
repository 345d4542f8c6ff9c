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

Where it listens: on the IPv4 addresses libp2p listens on (``listen_hosts``: every concrete
interface for ``--listen-host 0.0.0.0``), one port for all, never the wildcard. A host without
the secret of a closed cluster reaches that port but never gets a ticket.

Admission, so that connections without a ticket cannot starve ticket holders:

- on Linux a connection that has sent nothing reaches the node only after ``DEFER_ACCEPT``
  (10 s, ``TCP_DEFER_ACCEPT``); a fetcher sends its token right after connecting;
- a connection then waits, as *unredeemed*, at most ``TICKET_WAIT`` (2 s) for its token; at
  most ``MAX_UNREDEEMED`` (64) wait at once, ``PER_SOURCE_UNREDEEMED`` (32) of one source
  address; a new connection arriving when its source holds 32 closes that source's oldest,
  one arriving when 64 wait the oldest of the source holding the most
  (``exo_p2p.listen.admission``: a fetcher's token is read as soon as it is accepted, so a flood
  evicts itself, not the fetcher); while one is evicted on each arrival, accepts are paced to one per
  ``FULL_ACCEPT_PAUSE`` (2 ms), so a flood that reconnects at once costs bounded CPU and a
  fetcher waits at most its place in the accept queue times 2 ms;
- only a redeemed ticket takes one of the ``MAX_CONNECTIONS`` (16) serving slots; a ticket
  holder finding them all taken is closed (its fetcher falls back to the libp2p stream,
  ``exo_p2p.models.transfer.bulk_client``).

Integrity does not rest on the TCP path: every chunk is checked against the manifest's hash
(``PartialModel.write_chunk``). The bytes are not encrypted (the weights the manifest names).
Bounds: a serving connection silent for ``IDLE_TIMEOUT`` seconds between requests is closed,
as is one whose reader takes more than ``REPLY_TIMEOUT`` seconds to take one reply; a
request longer than ``MAX_REQUEST_BYTES`` closes it. The client side (connections, limits on
replies, the fall-back to libp2p) is ``exo_p2p.models.transfer.bulk_client``.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import socket
import struct
import time
from collections.abc import Callable, Sequence

import msgspec
import structlog
import trio

from exo_p2p.listen.admission import WaitingRoom, peer_ip
from exo_p2p.models.transfer.protocols import ChunkRequest, ChunkSource

log = structlog.get_logger(__name__)

TICKET_PROTOCOL = "/exo-p2p/model-bulk-ticket/1"
TOKEN_BYTES = 32
TICKET_TTL = 30.0
"""Seconds a ticket may wait before its connection presents it."""
TICKET_WAIT = 2.0
"""Seconds a new connection has to present its token (a fetcher sends it at once)."""
IDLE_TIMEOUT = 60.0
"""Seconds a serving connection may stay silent between two requests."""
REPLY_TIMEOUT = 30.0  # seconds a reader may take to take one reply (as the fetcher's bound)
MAX_CONNECTIONS = 16
"""Connections with a redeemed ticket served at once."""
MAX_UNREDEEMED = 64
"""Connections waiting to present a token at once; a newer one closes the oldest."""
PER_SOURCE_UNREDEEMED = 32
"""Of those, connections from one source address at most; a newer one from it closes its
oldest (``exo_p2p.listen.admission``): one host cannot take every waiting place."""
DEFER_ACCEPT = 10.0
"""Linux: the kernel hands a connection to the node only once it has sent a byte, or after
about this many seconds (``TCP_DEFER_ACCEPT``): silent connections cost no place at all."""
FULL_ACCEPT_PAUSE = 0.002
"""Seconds between two accepts while ``MAX_UNREDEEMED`` connections wait (at most 500
evictions a second: a flood that reconnects at once gets bounded CPU)."""
_LEN = struct.Struct(">I")
_REPLY = struct.Struct(">BQ")
MAX_REQUEST_BYTES = 64 * 1024


class BulkTicket(msgspec.Struct, frozen=True, array_like=True):
    """A one-time permission to open a bulk connection: TCP ``port`` and ``token`` (bytes)."""

    port: int
    token: bytes


class BulkError(RuntimeError):
    """The bulk path failed: no ticket, the connection was refused, broke, stalled or carried a
    malformed reply (message says why). The fetcher falls back to the libp2p stream."""


class BulkRefused(BulkError):
    """The holder answered a chunk request with an error (its message): an answer, not a
    failure of the path; the libp2p stream would give the same one."""


async def _receive_exactly(stream: trio.abc.ReceiveStream, n: int, *, stall: float = math.inf) -> bytes:
    """``n`` bytes from ``stream``; raises ``BulkError`` when it closes first or sends nothing
    for ``stall`` seconds."""
    buf = bytearray()
    while len(buf) < n:
        with trio.move_on_after(stall) as waited:
            part = await stream.receive_some(min(n - len(buf), 4 << 20))
        if waited.cancelled_caught:
            raise BulkError(f"nothing received for {stall} s after {len(buf)} of {n} bytes")
        if not part:
            raise BulkError(f"connection closed after {len(buf)} of {n} bytes")
        buf += part
    return bytes(buf)


def listen_hosts(addrs: Sequence[str]) -> list[str]:
    """The IPv4 addresses, in order and without repeats, of libp2p listen multiaddrs
    ``/ip4/A/tcp/P/...`` (what the bulk listener binds); ``["127.0.0.1"]`` when there is none.
    A wildcard ``0.0.0.0`` is never returned."""
    out: list[str] = []
    for addr in addrs:
        parts = addr.split("/")
        if len(parts) > 2 and parts[1] == "ip4" and parts[2] != "0.0.0.0" and parts[2] not in out:
            out.append(parts[2])
    return out or ["127.0.0.1"]


async def open_listeners(hosts: Sequence[str], *, attempts: int = 5) -> list[trio.SocketListener]:
    """One TCP listener per IPv4 address of ``hosts``, all on one free port (the ticket names
    one port), with ``DEFER_ACCEPT`` where the OS has it. Retries with another port when a
    later address finds the first's taken; raises ``OSError`` after ``attempts`` tries or when
    an address cannot be bound at all."""
    for attempt in range(attempts):
        listeners: list[trio.SocketListener] = []
        try:
            for host in hosts:
                port = listeners[0].socket.getsockname()[1] if listeners else 0
                listeners += await trio.open_tcp_listeners(port, host=host)
            for listener in listeners if hasattr(socket, "TCP_DEFER_ACCEPT") else []:  # Linux
                with contextlib.suppress(OSError):  # an optimisation only: admission holds without it
                    listener.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, int(DEFER_ACCEPT))
            return listeners
        except OSError:
            for listener in listeners:
                await listener.aclose()
            if attempt + 1 >= attempts or not listeners:
                raise
    raise OSError("no port free on every listen address")  # not reached: attempts >= 1


class Paced(trio.abc.Listener[trio.SocketStream]):
    """A listener that accepts at most one connection per ``FULL_ACCEPT_PAUSE`` seconds while
    ``full()``: a flood that is closed and reconnects at once cannot spin the node's CPU."""

    def __init__(self, inner: trio.SocketListener, full: Callable[[], bool]) -> None:
        self.inner, self.full = inner, full

    async def accept(self) -> trio.SocketStream:
        if self.full():
            await trio.sleep(FULL_ACCEPT_PAUSE)
        return await self.inner.accept()

    async def aclose(self) -> None:
        await self.inner.aclose()


class BulkServer:
    """Serves chunks of ``sources(digest)`` on a TCP port to holders of a valid ticket.

    ``register(net)`` serves ``TICKET_PROTOCOL``; ``run(hosts)`` (in a nursery) accepts
    connections on those IPv4 addresses (``listen_hosts``); ``port`` is known once ``run`` has
    started (``nursery.start``). Admission (module docstring): at most ``MAX_UNREDEEMED``
    connections wait ``TICKET_WAIT`` s for a token, the oldest closed first; only redeemed ones
    take one of ``MAX_CONNECTIONS`` serving slots. ``counts`` says how many connections were
    served, ``evicted`` (closed waiting for a token to make room), ``no_ticket`` (none or a bad
    one in time) and ``busy`` (a valid ticket, every slot taken).
    """

    def __init__(self, sources: Callable[[str], ChunkSource | None], *, clock: Callable[[], float] = time.monotonic) -> None:
        self._sources = sources
        self._clock = clock
        self._tickets: dict[bytes, tuple[str, str, float]] = {}  # token -> (peer, digest, expiry)
        self._serving = 0
        self._room = WaitingRoom(capacity=MAX_UNREDEEMED, per_source=PER_SOURCE_UNREDEEMED, wait=TICKET_WAIT)
        self.port = 0
        self.hosts: list[str] = []
        self.bytes_served = 0
        self.counts = {"served": 0, "evicted": 0, "no_ticket": 0, "busy": 0}

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

    async def run(self, hosts: Sequence[str], *, task_status=trio.TASK_STATUS_IGNORED) -> None:  # type: ignore[no-untyped-def]
        """Listen on ``hosts`` (IPv4 addresses, ``open_listeners``) and serve until cancelled;
        ``task_status.started(port)``. Raises ``OSError`` when they cannot be bound."""
        listeners = await open_listeners(hosts)
        self.port = listeners[0].socket.getsockname()[1]
        self.hosts = [listener.socket.getsockname()[0] for listener in listeners]
        log.info("bulk model transfer listening", hosts=self.hosts, port=self.port)
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, [Paced(listener, self._room.crowded) for listener in listeners])

    async def _admit(self, stream: trio.SocketStream) -> str | None:
        """Wait (as unredeemed, ``exo_p2p.listen.admission.WaitingRoom``) for the token; the digest of
        its ticket, or None (closed to make room for a newer connection, no valid token within
        ``TICKET_WAIT`` s)."""
        with self._room.enter(peer_ip(stream)) as place:
            self.counts["evicted"] = self._room.counts["evicted"]
            with place.scope:
                digest = self.redeem(await _receive_exactly(stream, TOKEN_BYTES))
                if digest is not None:
                    return digest
        if not place.evicted:  # else counted as evicted
            self.counts["no_ticket"] += 1
        return None

    async def _handle(self, stream: trio.SocketStream) -> None:
        digest: str | None = None  # stays None when no token came within TICKET_WAIT
        try:
            digest = await self._admit(stream)
            if digest is None:
                return
            if self._serving >= MAX_CONNECTIONS:
                self.counts["busy"] += 1
                return
            self._serving += 1
            self.counts["served"] += 1
            try:
                await self._serve(stream, digest)
            finally:
                self._serving -= 1
        except (BulkError, trio.BrokenResourceError, trio.ClosedResourceError, msgspec.DecodeError,
                msgspec.ValidationError, OSError) as exc:
            log.debug("bulk connection ended", error=repr(exc))
        except Exception:  # one connection's failure is not the listener's (nor the node's)
            log.exception("bulk connection handler failed")
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _serve(self, stream: trio.SocketStream, digest: str) -> None:
        """Answer chunk requests of ``digest`` on ``stream`` until it is closed, silent for
        ``IDLE_TIMEOUT`` s or sends a request longer than ``MAX_REQUEST_BYTES``."""
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
                reply = [_REPLY.pack(0, len(chunk)), chunk]
            except Exception as exc:  # the fetcher moves to another holder
                message = str(exc).encode()
                reply, chunk = [_REPLY.pack(1, len(message)) + message], b""
            with trio.move_on_after(REPLY_TIMEOUT) as slow:  # a reader that takes nothing is closed
                for part in reply:
                    await stream.send_all(part)
            if slow.cancelled_caught:
                return
            self.bytes_served += len(chunk)
