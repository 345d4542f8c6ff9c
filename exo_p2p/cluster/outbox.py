"""The local-event outbox: every event this node originates reaches the master exactly once.

Rules (``due``, ``first_sends``): each local event carries this node's id, an origin key
(``origin_boot``) and a sequence number; it stays pending until this node applies it back
indexed (the master drops duplicates by origin and sequence). A new event goes out at once,
alone (re-sending every pending event whenever one more is queued made O(n²) gossip under
bursts); one not seen indexed ``resend_interval`` s after it was last sent goes out again,
and all of them after a master change. A first send goes by gossip while the master says it
hears this node's gossip (``gossip_reaches``, from the direct heartbeat's answer), else over
a direct stream at once (a node that just (re)joined is often outside the master's GossipSub
mesh for a while: its first profile, gossiped, was lost and indexed only on the re-send a
second later); a re-send goes over a direct stream to the master; gossip when a direct send
fails. After this node's log was
replaced (a snapshot installed, a divergent tail dropped) a new origin epoch starts:
sequence numbers from 1 again, pending events re-queued under it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import structlog

from exo_p2p import defaults
from exo_p2p.cluster.common import Counters, Role, Wake
from exo_p2p.cluster.messages import LOCAL_EVENTS_PROTOCOL, LOCAL_EVENTS_TOPIC, LocalEventBatch, encode
from exo_p2p.cluster.settings import ClusterSettings, MasterHooks
from exo_p2p.types import Event, IndexedEvent, LocalEvent, State

log = structlog.get_logger(__name__)


def due(pending: Mapping[int, LocalEvent], sent_at: Mapping[int, float], now: float, interval: float) -> list[LocalEvent]:
    """Pending events never sent, or not sent for ``interval`` s, in sequence order."""
    return [pending[s] for s in sorted(pending) if now - sent_at.get(s, -math.inf) >= interval]


def first_sends(events: Sequence[LocalEvent], sent_at: Mapping[int, float], *,
                gossip_reaches: bool = True) -> tuple[list[LocalEvent], list[LocalEvent]]:
    """``events`` split into (to gossip, to send direct): never sent ones are gossiped while
    ``gossip_reaches`` (the master hears this node's gossip), re-sends always go direct."""
    if not gossip_reaches:
        return [], list(events)
    fresh = [e for e in events if e.origin_seq not in sent_at]
    again = [e for e in events if e.origin_seq in sent_at]
    return fresh, again


def batches(events: Sequence[LocalEvent], size: int) -> list[LocalEventBatch]:
    """``events`` in messages of ``size`` events at most, in order."""
    return [LocalEventBatch(tuple(events[i : i + size])) for i in range(0, len(events), size)]


class LocalOutbox:
    """``send(event)`` queues; ``run()`` delivers (module docstring)."""

    def __init__(self, net, role: Role, boot_id: str, hooks: MasterHooks, settings: ClusterSettings,  # type: ignore[no-untyped-def]
                 counters: Counters, clock: Callable[[], float]) -> None:
        self.net, self.role, self.boot_id, self.hooks = net, role, boot_id, hooks
        self.settings, self.counters, self.clock = settings, counters, clock
        self.seq = 0
        self.epoch = 0
        self.pending: dict[int, LocalEvent] = {}
        self.sent_at: dict[int, float] = {}
        self.wake = Wake()
        self.gossip_reaches: Callable[[str], bool] = lambda _master: True
        """Whether the master hears this node's gossip (set by the member: the direct heartbeat)."""

    @property
    def origin_boot(self) -> str:
        """The origin key our local events carry: the boot id, plus the epoch after a replacement."""
        return self.boot_id if self.epoch == 0 else f"{self.boot_id}.{self.epoch}"

    @property
    def idle(self) -> bool:
        """Whether every local event sent was seen indexed."""
        return not self.pending

    def pending_events(self) -> list[Event]:
        return [self.pending[s].event for s in sorted(self.pending)]

    def send(self, event: Event) -> None:
        """Queue a local event for the master; re-sent until seen indexed."""
        self.seq += 1
        self.pending[self.seq] = LocalEvent(self.role.node_id, self.origin_boot, self.seq, event)  # type: ignore[arg-type]
        self.wake.set()

    def on_master_change(self, _master: str | None) -> None:
        self.sent_at.clear()  # the new master may not have seen any of them
        self.wake.set()

    def on_log_replaced(self, _state: State) -> None:
        """Start a new origin epoch and re-queue what is pending under it (module docstring)."""
        pending = self.pending_events()
        self.epoch += 1
        self.seq = 0
        self.pending, self.sent_at = {}, {}
        for event in pending:
            self.send(event)
        log.info("log replaced; new origin epoch", epoch=self.epoch, resent=len(pending))

    def on_applied(self, event: IndexedEvent, _state: State) -> None:
        if event.origin == self.role.node_id and event.origin_boot == self.origin_boot:
            for seq in [s for s in self.pending if s <= event.origin_seq]:
                del self.pending[seq]
                self.sent_at.pop(seq, None)

    async def run(self) -> None:
        while True:
            await self.wake.wait(self.settings.resend_interval / 2)
            if not self.pending or self.role.master is None:
                continue
            now = self.clock()
            events = due(self.pending, self.sent_at, now, self.settings.resend_interval)
            if not events:
                continue
            master = self.role.master
            fresh, again = first_sends(events, self.sent_at, gossip_reaches=self.gossip_reaches(master))
            for local in events:
                self.sent_at[local.origin_seq] = now
            if self.role.is_master:
                for local in events:
                    await self.hooks.accept_local(local)
                continue
            gossip = fresh if not again or await self._send_direct(again) else events
            log.debug("local events sent", gossip=len(gossip), direct=len(events) - len(gossip), master=self.role.master)
            for batch in batches(gossip, self.settings.max_local_batch):
                await self.net.publish(LOCAL_EVENTS_TOPIC, encode(batch))

    async def _send_direct(self, events: list[LocalEvent]) -> bool:
        """Send re-sent local events to the master over a direct stream; False when it did not
        take them (unreachable, or no longer master)."""
        master = self.role.master
        if master is None:
            return False
        timeout = min(defaults.DIRECT_SEND_TIMEOUT, self.settings.request_timeout)
        try:
            for batch in batches(events, self.settings.max_local_batch):
                if await self.net.request(master, LOCAL_EVENTS_PROTOCOL, encode(batch), timeout=timeout) != b"ok":
                    return False
        except Exception as exc:  # noqa: BLE001 - fall back to gossip
            log.debug("direct local events failed", master=master, error=repr(exc))
            self.counters.drop("local_events_direct_failed")
            return False
        self.counters.add("local_events_direct", len(events))
        return True
