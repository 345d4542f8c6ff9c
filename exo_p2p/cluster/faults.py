"""Tests only: mistreat the gossip messages a node receives (dropped, duplicated, reordered: tests/test_gossip_loss.py).

``GossipFaults`` is the rule (pure apart from its seeded random generator): it decides, one
received message at a time, whether the message is dropped, delivered twice, or held and
delivered with the others of its window of ``reorder`` messages in a shuffled order.
``FaultyReceiver`` applies it to a subscription channel of ``exo_p2p.net`` (an async
iterator of ``(sender, data)``), so the cluster member reads it exactly as the channel.

It is switched on by ``--fault-hook`` keys only (``gossip_faults_from_hooks``); a node started
without them reads its channels directly (no wrapper, no cost). Use it to test that the
event log recovers from loss, duplication and reordering; it is not a network simulator
(latency, partitions: use network namespaces, tests/support/cluster.py ``NetnsLan``).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import structlog
import trio

log = structlog.get_logger(__name__)

T = TypeVar("T")

HOOK_DROP = "gossip_drop"
HOOK_DUP = "gossip_dup"
HOOK_REORDER = "gossip_reorder"
HOOK_SEED = "gossip_seed"
HOOK_HOLD = "gossip_hold"


@dataclass
class GossipFaults(Generic[T]):
    """Fault decisions for one stream of received messages.

    ``drop`` and ``dup`` are probabilities in [0, 1] (a message is dropped with probability
    ``drop``; a kept one is delivered twice with probability ``dup``); ``reorder`` is a window
    size in messages (≤ 1: no reordering): kept messages are held until ``reorder`` of them
    are waiting, then all are released in a random order (a duplicate stays next to its
    original, so it may come out before or after the others of the window). The same
    ``seed`` and the same input give the same output. Counters: ``dropped``,
    ``duplicated``, ``reordered`` (windows released in another order than received).

    Raises ``ValueError`` for a probability outside [0, 1] or a negative window.
    """

    drop: float = 0.0
    dup: float = 0.0
    reorder: int = 0
    seed: int = 0
    dropped: int = 0
    duplicated: int = 0
    reordered: int = 0
    _held: list[T] = field(default_factory=list, init=False, repr=False)
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for name, p in (("drop", self.drop), ("dup", self.dup)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"gossip fault {name}={p}: a probability must be in [0, 1]")
        if self.reorder < 0:
            raise ValueError(f"gossip fault reorder={self.reorder}: a window is ≥ 0 messages")
        self._rng = random.Random(self.seed)

    @property
    def held(self) -> int:
        """Messages waiting for their window to fill."""
        return len(self._held)

    def admit(self, message: T) -> list[T]:
        """Decide the fate of one received ``message``; returns what to deliver now, in
        order (empty when dropped or held)."""
        if self._rng.random() < self.drop:
            self.dropped += 1
            return []
        copies = [message]
        if self._rng.random() < self.dup:
            self.duplicated += 1
            copies.append(message)
        if self.reorder <= 1:
            return copies
        self._held.extend(copies)
        if len(self._held) < self.reorder:
            return []
        return self.flush()

    def flush(self) -> list[T]:
        """Release every held message, shuffled (used when a window stays partly empty)."""
        out, self._held = self._held, []
        order = list(range(len(out)))
        self._rng.shuffle(order)
        if order != sorted(order):
            self.reordered += 1
        return [out[i] for i in order]


def gossip_faults_from_hooks(hooks: Mapping[str, str], topic: str) -> GossipFaults | None:
    """The faults ``--fault-hook`` asks for on a received topic, or None when none is set.

    Keys: ``gossip_drop=P``, ``gossip_dup=P`` (probabilities), ``gossip_reorder=K`` (window
    in messages), ``gossip_seed=N`` (default 0; each topic mixes in its name so two topics
    do not make the same decisions). Raises ``ValueError`` naming a malformed value."""
    if not any(k in hooks for k in (HOOK_DROP, HOOK_DUP, HOOK_REORDER)):
        return None
    try:
        drop = float(hooks.get(HOOK_DROP, "0"))
        dup = float(hooks.get(HOOK_DUP, "0"))
        reorder = int(hooks.get(HOOK_REORDER, "0"))
        seed = int(hooks.get(HOOK_SEED, "0"))
    except ValueError as exc:
        raise ValueError(f"bad gossip fault hook: {exc}") from None
    topic_salt = sum(ord(c) * 31**i for i, c in enumerate(topic)) % 2**32  # stable across runs (unlike hash())
    return GossipFaults(drop=drop, dup=dup, reorder=reorder, seed=seed * 2**32 + topic_salt)


def with_gossip_faults(channel, hooks: Mapping[str, str], topic: str, count: Callable[[str, int], None]):  # type: ignore[no-untyped-def]
    """``channel`` with the gossip faults of ``hooks`` applied (counted by ``count(key, n)``
    as ``fault_dropped:<topic>``, ``fault_duplicated:<topic>``, ``fault_reordered:<topic>``);
    ``channel`` itself when no such hook is set."""
    faults = gossip_faults_from_hooks(hooks, topic)
    if faults is None:
        return channel
    log.warning("gossip fault injection on (tests only)", topic=topic, drop=faults.drop, dup=faults.dup, reorder=faults.reorder)
    return FaultyReceiver(channel, faults, hold=hold_from_hooks(hooks), on_count=lambda kind, n: count(f"fault_{kind}:{topic}", n))


def hold_from_hooks(hooks: Mapping[str, str], default: float = 0.3) -> float:
    """Seconds a partly filled reorder window is held at most (``gossip_hold=S``)."""
    return float(hooks.get(HOOK_HOLD, default))


class FaultyReceiver(Generic[T]):
    """An async iterator over ``channel`` with ``faults`` applied to every message.

    A message held for reordering is released at the latest ``hold`` seconds after the
    first of its window was held (without it, the last messages of a burst would wait for
    the next burst). ``on_count(kind, n)`` is told of each decision as it is made
    (``"dropped"``, ``"duplicated"``, ``"reordered"``), so counters stay current. Iteration
    ends when ``channel`` is closed (held messages are delivered first)."""

    def __init__(
        self,
        channel,  # trio.MemoryReceiveChannel[T] (anything with ``receive()``)
        faults: GossipFaults[T],
        *,
        hold: float = 0.3,
        on_count: Callable[[str, int], None] | None = None,
    ) -> None:
        self.channel = channel
        self.faults = faults
        self.hold = hold
        self._ready: deque[T] = deque()
        self._on_count = on_count
        self._held_since: float | None = None

    def __aiter__(self) -> "FaultyReceiver[T]":
        return self

    def _take(self, batch: list[T], before: tuple[int, int, int]) -> None:
        f = self.faults
        if self._on_count is not None:
            for kind, old, new in zip(("dropped", "duplicated", "reordered"), before, (f.dropped, f.duplicated, f.reordered)):
                if new > old:
                    self._on_count(kind, new - old)
        self._ready.extend(batch)
        if not f.held:
            self._held_since = None
        elif self._held_since is None:
            self._held_since = trio.current_time()

    async def __anext__(self) -> T:
        while not self._ready:
            f = self.faults
            before = (f.dropped, f.duplicated, f.reordered)
            if self._held_since is None:
                try:
                    message = await self.channel.receive()
                except (trio.EndOfChannel, trio.ClosedResourceError):
                    raise StopAsyncIteration from None
                self._take(f.admit(message), before)
                continue
            with trio.move_on_at(self._held_since + self.hold):
                try:
                    message = await self.channel.receive()
                except (trio.EndOfChannel, trio.ClosedResourceError):
                    self._take(f.flush(), before)
                    if not self._ready:
                        raise StopAsyncIteration from None
                    break
                self._take(f.admit(message), before)
                continue
            self._take(f.flush(), before)  # the window's time is up
        return self._ready.popleft()


# --- chunk streams ---------------------------------------------------------------------------

HOOK_CHUNK_DROP = "chunk_drop"
HOOK_CHUNK_DUP = "chunk_dup"
HOOK_CHUNK_REORDER = "chunk_reorder"
HOOK_CHUNK_SEED = "chunk_seed"


def chunk_faults_from_hooks(hooks: Mapping[str, str]) -> GossipFaults | None:
    """The faults ``--fault-hook`` asks for on the numbered chunks this node sends to other
    nodes (``chunk_drop=P``, ``chunk_dup=P``, ``chunk_reorder=K``, ``chunk_seed=N``; as for
    gossip), or None when none is set. Raises ``ValueError`` naming a malformed value."""
    if not any(k in hooks for k in (HOOK_CHUNK_DROP, HOOK_CHUNK_DUP, HOOK_CHUNK_REORDER)):
        return None
    try:
        return GossipFaults(
            drop=float(hooks.get(HOOK_CHUNK_DROP, "0")),
            dup=float(hooks.get(HOOK_CHUNK_DUP, "0")),
            reorder=int(hooks.get(HOOK_CHUNK_REORDER, "0")),
            seed=int(hooks.get(HOOK_CHUNK_SEED, "0")),
        )
    except ValueError as exc:
        raise ValueError(f"bad chunk fault hook: {exc}") from None


class FaultyChunkSender:
    """Tests only: ``send(destination, chunk, seq)`` with ``faults`` applied to every
    numbered chunk, between the numbering and the network, so the receiving node sees a
    stream with chunks lost, duplicated and reordered (``exo_p2p.chunks.order`` must cope).

    Held chunks (a reorder window not yet full) go out at the latest ``hold`` seconds after
    the first of them was held: ``run()`` (a background task) releases them.
    ``on_count(kind, n)`` as for ``FaultyReceiver``."""

    def __init__(
        self,
        send: Callable[[str, object, int], None],
        faults: GossipFaults,
        *,
        hold: float = 0.3,
        on_count: Callable[[str, int], None] | None = None,
    ) -> None:
        self._send = send
        self.faults = faults
        self.hold = hold
        self._on_count = on_count
        self._held_since: float | None = None

    def __call__(self, destination: str, chunk: object, seq: int) -> None:
        self._release(lambda: self.faults.admit((destination, chunk, seq)))

    def _release(self, decide: Callable[[], list]) -> None:
        f = self.faults
        before = (f.dropped, f.duplicated, f.reordered)
        out = decide()
        if self._on_count is not None:
            for kind, old, new in zip(("dropped", "duplicated", "reordered"), before, (f.dropped, f.duplicated, f.reordered)):
                if new > old:
                    self._on_count(kind, new - old)
        for destination, chunk, seq in out:
            self._send(destination, chunk, seq)
        if not f.held:
            self._held_since = None
        elif self._held_since is None:
            self._held_since = trio.current_time()

    async def run(self) -> None:
        """Release held chunks whose window did not fill within ``hold`` seconds; forever."""
        while True:
            await trio.sleep(self.hold / 4)
            if self._held_since is not None and trio.current_time() - self._held_since >= self.hold:
                self._release(self.faults.flush)
HOOK_HEARTBEAT_GOSSIP_OFF = "heartbeat_gossip_off"
"""``--fault-hook heartbeat_gossip_off=1``: the node publishes no heartbeat on gossip, as if
GossipSub never delivered its heartbeats (its direct heartbeats to the master still go)."""
