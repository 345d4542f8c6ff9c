"""Gossip topics of one host: paced publishing, and one drain task per topic fanning each
message out to every subscriber of it.

Gossip is lossy (docs/architecture.md#networking-notes, note 3): pubsub drops a message when a
peer's outbound queue or a subscription queue is full. Publishing therefore waits while any
peer's queue is near full, and every topic's subscription is drained by a task of its own so
the library's queue never fills; what is lost is counted, never raised.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Iterable
from typing import Any

import structlog
import trio
from libp2p.peer.id import ID
from libp2p.pubsub.pubsub import Pubsub

from .config import GossipParams

log = structlog.get_logger(__name__)

Message = tuple[str, bytes]  # (sender node id, data)
_Subscriber = tuple[trio.MemorySendChannel[Message], bool]  # (channel, include_own)

QUEUE_POLL = 0.002
"""Seconds between two looks at the peers' outbound queues while a publish waits for room."""


def queues_have_room(queue_lengths: Iterable[int], high_water: int) -> bool:
    """Whether every peer's outbound queue holds fewer than ``high_water`` RPCs (True when
    there are no peers): the condition under which a publish goes out at once."""
    return all(length < high_water for length in queue_lengths)


class GossipTopics:
    """Publish and subscribe on the gossip topics of one host (``Network`` delegates here).

    Guarantees: ``publish`` never raises (but for cancellation) and waits at most
    ``params.publish_max_wait`` seconds for queue room; a subscriber that falls behind loses
    messages (counted) and never blocks another subscriber or the library. Drain tasks live in
    the host's nursery and close their subscribers' channels when they end.
    """

    def __init__(
        self,
        pubsub: Pubsub,
        own_id: bytes,
        params: GossipParams,
        nursery: trio.Nursery,
        count: Callable[[str], None],
    ) -> None:
        self._pubsub = pubsub
        self._own_id = own_id
        self._params = params
        self._nursery = nursery
        self._count = count
        self._publish_lock = trio.Lock()
        self._subscribers: dict[str, list[_Subscriber]] = {}

    async def publish(self, topic: str, data: bytes) -> bool:
        """See ``Network.publish``."""
        params = self._params
        if len(data) > params.max_payload_bytes:
            self._count("publish_oversize")
            return False
        try:
            async with self._publish_lock:
                await self._wait_for_queue_room()
                await self._pubsub.publish(topic, data)
            self._count(f"published:{topic}")
            return True
        except trio.Cancelled:
            raise
        except Exception as exc:
            self._count("publish_failed")
            log.warning("publish failed", topic=topic, error=repr(exc))
            return False

    async def _wait_for_queue_room(self) -> None:
        params = self._params
        deadline = trio.current_time() + params.publish_max_wait
        while True:
            lengths = [len(q) for q in self._pubsub.peer_queues.values()]
            if queues_have_room(lengths, params.queue_high_water):
                return
            if trio.current_time() >= deadline:
                self._count("publish_queue_full")
                return
            await trio.sleep(QUEUE_POLL)

    async def subscribe(
        self, topic: str, *, buffer: int, include_own: bool
    ) -> trio.MemoryReceiveChannel[Message]:
        """See ``Network.subscribe``."""
        send, recv = trio.open_memory_channel[Message](buffer)
        subscribers = self._subscribers.get(topic)
        if subscribers is None:
            subscribers = self._subscribers[topic] = []
            subscription = await self._pubsub.subscribe(topic)
            self._nursery.start_soon(self._drain, topic, subscription, subscribers)
        subscribers.append((send, include_own))
        return recv

    async def _drain(
        self,
        topic: str,
        subscription: AsyncIterable[Any],
        subscribers: list[_Subscriber],
    ) -> None:
        own = self._own_id
        try:
            async for msg in subscription:
                try:
                    sender = str(ID(msg.from_id))
                except Exception:
                    self._count(f"invalid_sender:{topic}")
                    continue
                item = (sender, bytes(msg.data))
                is_own = msg.from_id == own
                for entry in list(subscribers):
                    send, include_own = entry
                    if is_own and not include_own:
                        continue
                    try:
                        send.send_nowait(item)
                    except trio.WouldBlock:
                        self._count(f"subscriber_full:{topic}")
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        subscribers.remove(entry)
        finally:
            for send, _ in subscribers:
                send.close()
