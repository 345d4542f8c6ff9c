"""The probe listener: where peers measure this node's addresses (docs/links.md).

A peer measures each of this node's addresses over a plain TCP connection to that address,
opened by a one-time ticket it got over the cluster's own authenticated connection, the way
model chunks travel (``exo_p2p.models.transfer.bulk``):

1. the prober asks for tickets over ``TICKET_PROTOCOL`` (a libp2p request/response: Noise,
   and PSK-private when the cluster has a secret), one per address it will probe; only a node
   in State gets any. Each ticket is ``(token, proof)``: 16 random bytes each, valid for one
   connection within ``TICKET_TTL`` s;
2. the prober connects to the address at ``port`` and sends the token; this node answers the
   proof, so the prober knows it reached this node and not whatever else holds that IP;
3. then, one at a time: ``b"p"`` + ``PROBE_BYTES`` bytes, echoed back (a round trip), or
   ``b"b"`` + a 4-byte big-endian length (≤ ``BANDWIDTH_BYTES``) + that many bytes, answered
   with one byte once all arrived (a timed transfer).

Admission (``exo_p2p.listen.admission``), so that no crowd of connections can starve the probes of
members: a new connection *waits* for its token at most ``TOKEN_WAIT`` s (its handshake
deadline); at most ``MAX_WAITING`` wait at once, ``PER_SOURCE_WAITING`` of one source address;
one arriving beyond either closes the oldest waiting connection of its own source (or of the
source holding the most), so a crowd evicts itself while a prober, which sends its token as
soon as it connects, is read at once; while one is evicted on each arrival, accepts are paced
(``exo_p2p.models.transfer.bulk.Paced``). Only a redeemed ticket, issued to a member, takes one of the
``MAX_CONNECTIONS`` serving slots, ``PER_PEER_CONNECTIONS`` of them for one peer id (the
ticket's). A served connection silent for ``IDLE_TIMEOUT`` s or older than ``MAX_LIFETIME`` s
is closed. Bounds: at most ``MAX_TICKETS`` unredeemed tickets (the oldest dropped),
``MAX_TOKENS`` per request. A prober that is refused counts the round as inconclusive, never
as a lost link (``exo_p2p.links.prober``). What a peer can make this node spend is thus a few
MiB and milliseconds per ticket, and tickets go only to members.
"""

from __future__ import annotations

import secrets
import struct
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence

import msgspec
import structlog
import trio

from exo_p2p.links.figures import BANDWIDTH_BYTES, PROBE_BYTES
from exo_p2p.listen.admission import WaitingRoom, peer_ip
from exo_p2p.models.transfer.bulk import Paced, open_listeners

log = structlog.get_logger(__name__)

TICKET_PROTOCOL = "/exo-p2p/link-probe-ticket/1"
TICKET_TTL = 30.0
"""Seconds a ticket may wait for its connection."""
MAX_TICKETS = 256
"""Unredeemed tickets kept at most (the oldest is dropped first)."""
MAX_TOKENS = 8
"""Tickets one request may ask for (one per address of this node)."""
TOKEN_WAIT = 2.0
"""Seconds a new connection has to present its token."""
IDLE_TIMEOUT = 10.0
"""Seconds a probe connection may stay silent between two probes."""
MAX_LIFETIME = 30.0
"""Seconds a probe connection lives at most."""
MAX_CONNECTIONS = 16
"""Probe connections with a redeemed ticket served at once."""
PER_PEER_CONNECTIONS = 4
"""Of those, connections served at once for one peer id (the one its ticket was issued to)."""
MAX_WAITING = 64
"""Connections waiting for their token at once; a newer one closes an older one."""
PER_SOURCE_WAITING = 16
"""Of those, connections from one source address at most (a newer one closes its oldest)."""
TOKEN_BYTES = 16


class TicketRequest(msgspec.Struct, frozen=True, array_like=True):
    """Ask for ``count`` tickets (1..``MAX_TOKENS``)."""

    count: int


class ProbeTicket(msgspec.Struct, frozen=True, array_like=True):
    """``port``: where this node's probe listener listens on each of its addresses;
    ``tickets``: (token the prober sends, proof this node answers), one per connection."""

    port: int
    tickets: tuple[tuple[bytes, bytes], ...]


class ProbeServer:
    """Issues tickets over libp2p and answers probes on a TCP port (module docstring).

    ``register(net, members)`` serves ``TICKET_PROTOCOL`` to nodes ``members()`` holds;
    ``run(hosts)`` listens on those IPv4 addresses (``nursery.start``: ``port`` is known after)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.port = 0
        self.tickets: OrderedDict[bytes, tuple[bytes, float, str]] = OrderedDict()
        self.room = WaitingRoom(capacity=MAX_WAITING, per_source=PER_SOURCE_WAITING, wait=TOKEN_WAIT)
        self.serving: Counter[str] = Counter()  # peer id -> connections served now
        self.served = 0
        self.refused = 0

    def register(self, net, members: Callable[[], object]) -> None:  # type: ignore[no-untyped-def]
        """Serve tickets to peers that are nodes of ``members()`` (a container of node ids)."""

        async def handle(peer: str, data: bytes) -> bytes:
            if peer not in members():  # type: ignore[operator]
                raise PermissionError("not a member of this cluster")
            request = msgspec.msgpack.decode(data, type=TicketRequest)
            return msgspec.msgpack.encode(self.issue(request.count, peer))

        net.set_request_handler(TICKET_PROTOCOL, handle)

    def issue(self, count: int, peer: str = "") -> ProbeTicket:
        """``count`` (clamped to 1..``MAX_TOKENS``) fresh tickets for ``peer`` (a node id);
        drops expired and excess ones."""
        now = self.clock()
        for token, (_, at, _) in list(self.tickets.items()):
            if now - at > TICKET_TTL:
                del self.tickets[token]
        out = []
        for _ in range(max(1, min(MAX_TOKENS, count))):
            token, proof = secrets.token_bytes(TOKEN_BYTES), secrets.token_bytes(TOKEN_BYTES)
            self.tickets[token] = (proof, now, peer)
            out.append((token, proof))
        while len(self.tickets) > MAX_TICKETS:
            self.tickets.popitem(last=False)
        return ProbeTicket(self.port, tuple(out))

    def redeem(self, token: bytes) -> tuple[bytes, str] | None:
        """(proof, peer) of a valid unused ``token`` (used up now), or None."""
        entry = self.tickets.pop(token, None)
        if entry is None or self.clock() - entry[1] > TICKET_TTL:
            return None
        return entry[0], entry[2]

    @property
    def open(self) -> int:
        """Connections open now: waiting for a token or served."""
        return len(self.room) + sum(self.serving.values())

    async def run(self, hosts: Sequence[str], *, task_status=trio.TASK_STATUS_IGNORED) -> None:  # type: ignore[no-untyped-def]
        """Listen on ``hosts`` (IPv4 addresses) and serve until cancelled;
        ``task_status.started(port)``. Raises ``OSError`` when they cannot be bound."""
        listeners = await open_listeners(hosts)
        self.port = listeners[0].socket.getsockname()[1]
        log.info("link probe listener", hosts=list(hosts), port=self.port)  # once at start: where peers measure us
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, [Paced(listener, self.room.crowded) for listener in listeners])

    async def _admit(self, stream: trio.SocketStream) -> tuple[bytes, str] | None:
        """Wait in the room for a token: (proof, peer) of its ticket, or None (evicted, no
        valid token within ``TOKEN_WAIT`` s)."""
        ticket = None
        with self.room.enter(peer_ip(stream)) as place:
            with place.scope:
                ticket = self.redeem(await receive_exactly(stream, TOKEN_BYTES))
        return ticket

    def _slot(self, peer: str) -> bool:
        """Take a serving slot for ``peer`` when one is free (``MAX_CONNECTIONS`` in all,
        ``PER_PEER_CONNECTIONS`` for one peer)."""
        if sum(self.serving.values()) >= MAX_CONNECTIONS or self.serving[peer] >= PER_PEER_CONNECTIONS:
            return False
        self.serving[peer] += 1
        return True

    async def _handle(self, stream: trio.SocketStream) -> None:
        peer: str | None = None
        try:
            with trio.move_on_after(MAX_LIFETIME):
                ticket = await self._admit(stream)
                if ticket is None or not self._slot(ticket[1]):
                    self.refused += 1
                    return
                proof, peer = ticket
                await stream.send_all(proof)
                await self._serve(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ProbeClosed, OSError):
            pass
        except Exception:  # one connection's failure is not the listener's (nor the node's)
            log.exception("probe connection handler failed")
        finally:
            if peer is not None:
                self.serving[peer] -= 1
                if not self.serving[peer]:
                    del self.serving[peer]
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _serve(self, stream: trio.SocketStream) -> None:
        while True:
            with trio.move_on_after(IDLE_TIMEOUT) as idle:
                op = await receive_exactly(stream, 1)
            if idle.cancelled_caught:
                return
            if op == b"p":
                await stream.send_all(await receive_exactly(stream, PROBE_BYTES))
            elif op == b"b":
                (size,) = struct.unpack(">I", await receive_exactly(stream, 4))
                if size > BANDWIDTH_BYTES:
                    return
                left = size
                while left:
                    part = await stream.receive_some(min(left, 1 << 20))
                    if not part:
                        raise ProbeClosed("closed during a transfer")
                    left -= len(part)
                await stream.send_all(b"k")
            else:
                return
            self.served += 1


class ProbeClosed(ConnectionError):
    """The other end closed a probe connection early."""


async def receive_exactly(stream: trio.abc.ReceiveStream, n: int) -> bytes:
    """``n`` bytes from ``stream``; raises ``ProbeClosed`` when it closes first."""
    buf = bytearray()
    while len(buf) < n:
        part = await stream.receive_some(n - len(buf))
        if not part:
            raise ProbeClosed(f"closed after {len(buf)} of {n} bytes")
        buf += part
    return bytes(buf)
