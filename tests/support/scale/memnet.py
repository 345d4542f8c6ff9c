"""An in-memory stand-in for ``exo_p2p.net.host.Network``: the libp2p layer replaced at its
interface (docs/cluster.md, "Many machines"), for the control-plane scale harness.

A ``Fabric`` is the shared medium of one trio run: every ``MemoryNet`` added to it is one
node's ``Network``. It models what the cluster code relies on and nothing more:

- gossip (``publish``/``subscribe``): one copy to every connected subscriber of the topic,
  after ``latency`` s (± ``jitter``), each copy lost with probability ``loss``; a subscriber
  whose channel is full loses the message (counted, like ``subscriber_full:<topic>``);
- request/response (``request``/``set_request_handler``): the handler runs after
  ``latency`` s, its reply comes back ``latency`` s later. Streams run over TCP, so a lost
  packet (``loss``, per leg) is resent, not lost: it costs ``RETRANSMIT`` s more (Linux's
  minimum retransmission timeout). A handler that raises or runs past its timeout gives
  ``RemoteError``; a dead or unconnected peer, or the caller's ``timeout``, ``RequestError``;
- connections (``dial``, ``connected_peers``, ``peer_events``): symmetric, made by a dial or by
  ``connect`` (the harness's stand-in for mDNS discovery), broken by ``kill``.

Traffic is counted per node (``Traffic``): messages and payload bytes sent and received. A
gossip publish counts once as sent and once per delivered copy as received: that is the
payload every node must read; GossipSub on the wire adds its mesh forwarding (each node
re-sends a message to up to ``degree`` = 6 peers) and IHAVE gossip on top (docs/cluster.md).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from exo_p2p.net.errors import DialError, RemoteError, RequestError

Handler = Callable[[str, bytes], Awaitable[bytes]]
RETRANSMIT = 0.2
"""Seconds a lost packet of a stream costs (TCP resends it after its RTO, 200 ms minimum on Linux)."""
MAX_PAYLOAD = 512 * 1024
"""Largest gossip message, as ``exo_p2p.net.config.GossipConfig.max_payload_bytes``."""


@dataclass
class Traffic:
    """Per-node counts: messages and payload bytes sent and received (gossip and requests)."""

    msgs_out: int = 0
    bytes_out: int = 0
    msgs_in: int = 0
    bytes_in: int = 0

    def total(self) -> tuple[int, int]:
        """(messages, bytes) in both directions."""
        return self.msgs_out + self.msgs_in, self.bytes_out + self.bytes_in


class Fabric:
    """The medium (module docstring). ``latency``/``jitter`` in seconds, ``loss`` a probability
    in [0, 1); ``seed`` makes losses and jitter repeatable. Raises ``ValueError`` on a bad figure."""

    def __init__(self, *, latency: float = 0.001, jitter: float = 0.0, loss: float = 0.0, seed: int = 0) -> None:
        if latency < 0 or jitter < 0 or jitter > latency or not 0 <= loss < 1:
            raise ValueError(f"bad fabric figures: latency={latency} jitter={jitter} loss={loss}")
        self.latency, self.jitter, self.loss = latency, jitter, loss
        self.rng = random.Random(seed)
        self.nets: dict[str, MemoryNet] = {}
        self.traffic: dict[str, Traffic] = {}
        self.nursery: trio.Nursery | None = None

    def add(self, node_id: str, ip: str) -> MemoryNet:
        """A new node's ``Network`` (alive, not connected yet)."""
        net = MemoryNet(self, node_id, ip)
        self.nets[node_id] = net
        self.traffic[node_id] = Traffic()
        return net

    def delay(self) -> float:
        return self.latency + (self.rng.uniform(-self.jitter, self.jitter) if self.jitter else 0.0)

    def lost(self) -> bool:
        return self.loss > 0 and self.rng.random() < self.loss

    def connect(self, a: str, b: str) -> None:
        """Connect two live nodes both ways (no-op when connected or either is dead)."""
        na, nb = self.nets.get(a), self.nets.get(b)
        if a == b or na is None or nb is None or not (na.alive and nb.alive) or b in na.peers:
            return
        na.peers.add(b)
        nb.peers.add(a)
        na.peer_changed(b, True)
        nb.peer_changed(a, True)

    def kill(self, node_id: str) -> None:
        """The node dies: its connections close (peers see it disconnect), nothing reaches it."""
        net = self.nets[node_id]
        net.alive = False
        for peer in list(net.peers):
            self.nets[peer].peers.discard(node_id)
            self.nets[peer].peer_changed(node_id, False)
        net.peers.clear()
        for send, _topic, _own in net.subscribers.values():
            send.close()
        net.subscribers.clear()

    def gossip(self, sender: str, topic: str, data: bytes) -> None:
        """Deliver ``data`` from ``sender`` to every connected subscriber after a delay."""
        assert self.nursery is not None, "the fabric runs in a nursery (Fabric.nursery)"
        self.nursery.start_soon(self._deliver, sender, topic, data, self.delay())

    async def _deliver(self, sender: str, topic: str, data: bytes, delay: float) -> None:
        await trio.sleep(delay)
        src = self.nets[sender]
        targets = [sender, *src.peers] if src.alive else []
        for node_id in targets:
            net = self.nets[node_id]
            own = node_id == sender
            if not own and self.lost():
                continue
            net.receive(topic, sender, data, own)


class MemoryNet:
    """One node's ``Network`` on a ``Fabric`` (the methods ``exo_p2p.cluster`` calls)."""

    def __init__(self, fabric: Fabric, node_id: str, ip: str) -> None:
        self.fabric, self.node_id, self.ip = fabric, node_id, ip
        self.alive = True
        self.peers: set[str] = set()
        self.subscribers: dict[int, tuple[trio.MemorySendChannel, str, bool]] = {}  # type: ignore[assignment]
        self.handlers: dict[str, tuple[Handler, float]] = {}
        self.listeners: list[trio.MemorySendChannel] = []
        self.counters: dict[str, int] = {}
        self.max_payload_bytes = MAX_PAYLOAD

    def _count(self, kind: str) -> None:
        self.counters[kind] = self.counters.get(kind, 0) + 1

    def listen_addrs(self) -> list[str]:
        return [f"/ip4/{self.ip}/tcp/4001/p2p/{self.node_id}"]

    # -- peers ------------------------------------------------------------------------------
    def connected_peers(self) -> set[str]:
        return set(self.peers)

    def peer_addrs(self, peer_id: str) -> list[str]:
        net = self.fabric.nets.get(peer_id)
        return net.listen_addrs() if net is not None else []

    def peer_events(self, buffer: int = 256) -> trio.MemoryReceiveChannel:
        send, recv = trio.open_memory_channel(buffer)
        for peer in sorted(self.peers):
            send.send_nowait((peer, True))
        self.listeners.append(send)
        return recv

    def peer_changed(self, peer: str, connected: bool) -> None:
        for send in self.listeners:
            try:
                send.send_nowait((peer, connected))
            except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                self._count("peer_event_dropped")

    async def dial(self, addr: str, *, timeout: float) -> str:
        """Connect to ``/ip4/A/tcp/P/p2p/<node_id>``; ``DialError`` when it is dead or unknown."""
        peer = addr.rsplit("/p2p/", 1)[-1]
        target = self.fabric.nets.get(peer)
        with trio.move_on_after(timeout):
            await trio.sleep(2 * self.fabric.delay())
            if target is None or not target.alive or not self.alive:
                raise DialError(f"cannot reach {addr}")
            self.fabric.connect(self.node_id, peer)
            return peer
        raise DialError(f"dial {addr} timed out")

    # -- gossip -----------------------------------------------------------------------------
    async def publish(self, topic: str, data: bytes) -> bool:
        if not self.alive:
            return False
        if len(data) > self.max_payload_bytes:
            self._count("publish_oversize")
            return False
        traffic = self.fabric.traffic[self.node_id]
        traffic.msgs_out += 1
        traffic.bytes_out += len(data)
        self.fabric.gossip(self.node_id, topic, data)
        return True

    async def subscribe(self, topic: str, *, buffer: int = 1024, include_own: bool = False) -> trio.MemoryReceiveChannel:
        send, recv = trio.open_memory_channel(buffer)
        self.subscribers[id(send)] = (send, topic, include_own)
        return recv

    def receive(self, topic: str, sender: str, data: bytes, own: bool) -> None:
        """One delivered gossip copy (called by the fabric)."""
        if not own:
            traffic = self.fabric.traffic[self.node_id]
            traffic.msgs_in += 1
            traffic.bytes_in += len(data)
        for key, (send, sub_topic, include_own) in list(self.subscribers.items()):
            if sub_topic != topic or (own and not include_own):
                continue
            try:
                send.send_nowait((sender, data))
            except trio.WouldBlock:
                self._count(f"subscriber_full:{topic}")
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                self.subscribers.pop(key, None)

    # -- request / response -----------------------------------------------------------------
    def set_request_handler(self, protocol: str, handler: Handler, *, timeout: float | None = None) -> None:
        self.handlers[protocol] = (handler, timeout if timeout is not None else 10.0)

    async def request(self, peer_id: str, protocol: str, data: bytes, *, timeout: float) -> bytes:
        """``handler(own id, data)`` on ``peer_id`` (module docstring for the failures)."""
        with trio.move_on_after(timeout):
            return await self._exchange(peer_id, protocol, data)
        raise RequestError(f"request {protocol} to {peer_id} timed out")

    async def _exchange(self, peer_id: str, protocol: str, data: bytes) -> bytes:
        fabric = self.fabric
        target = fabric.nets.get(peer_id)
        if target is None or not target.alive or peer_id not in self.peers:
            await trio.sleep(fabric.delay())
            raise RequestError(f"no connection to {peer_id}")
        self._account(peer_id, data)
        await trio.sleep(fabric.delay() + (RETRANSMIT if fabric.lost() else 0.0))
        if protocol not in target.handlers:
            await trio.sleep_forever()  # the caller's timeout ends it, as an unanswered stream does
        handler, handler_timeout = target.handlers[protocol]
        try:
            with trio.fail_after(handler_timeout):
                reply = await handler(self.node_id, data)
        except trio.TooSlowError as exc:
            raise RemoteError(f"handler of {protocol} timed out") from exc
        except Exception as exc:  # noqa: BLE001 - the remote's failure, as a stream reports it
            raise RemoteError(repr(exc)) from exc
        if not target.alive:
            await trio.sleep_forever()
        target._account(self.node_id, reply)
        await trio.sleep(fabric.delay() + (RETRANSMIT if fabric.lost() else 0.0))
        return reply

    def _account(self, peer_id: str, data: bytes) -> None:
        """Count one message of ``data`` from this node to ``peer_id``."""
        out, into = self.fabric.traffic[self.node_id], self.fabric.traffic[peer_id]
        out.msgs_out += 1
        out.bytes_out += len(data)
        into.msgs_in += 1
        into.bytes_in += len(data)
