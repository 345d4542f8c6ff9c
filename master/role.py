"""The master role: the single writer of the replicated log (docs/architecture.md#request-flow).

It accepts local events (de-duplicated per origin), decides commands, indexes every
resulting event with ``(term, idx)``, hands it to the node's replica (which persists and
applies it) and to ``publish`` (gossip to the peers), then sequences the reactions the new
State calls for. Commands are answered only after their events are committed.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import msgspec
import structlog
import trio

from exo_p2p.replica import Replica
from exo_p2p.types import (
    Command,
    CommandResult,
    ErrorInfo,
    Event,
    HubModelsForgotten,
    IndexedEvent,
    InstanceDeleted,
    PlaceInstance,
    LocalEvent,
    NodeId,
    RankSettings,
    State,
    TaskCreated,
)
from master.commands import handle_command
from master.local_rules import refuse_local
from master.reactions import react
from exo_p2p.state.hub_cards import HUB_CARD_IDLE_S
from master.hub_forget import HubForgetClock
from master.idle import IdleClock, idle_reason, unload_events
from master.relink import RelinkClock
from master.sequencer import OriginSeqs

log = structlog.get_logger(__name__)


class MasterRole:
    """Sequencing for one term.

    ``replica`` is this node's replica (the master's State is the replica's State);
    ``publish`` is awaited for every indexed event (never raises: gossip counts its own
    drops); ``wait_committed(idx)`` returns once event ``idx`` is committed (docs/architecture.md#log-guarantees:
    persisted in a one-node cluster, applied by another node otherwise).
    """

    def __init__(
        self,
        node_id: NodeId,
        term: int,
        replica: Replica,
        publish: Callable[[IndexedEvent], Awaitable[None]],
        *,
        wait_committed: Callable[[int], Awaitable[None]] | None = None,
        queue_limit: int | None = None,
        reachable: Callable[[], set[str]] | None = None,
        heard_ago: Callable[[str], float | None] | None = None,
        rank_settings: RankSettings | None = None,
        restore_size: bool = True,
        relink: bool = True,
        routing: str = "prefix",
        hub_card_idle: float = HUB_CARD_IDLE_S,
    ) -> None:
        self.node_id = node_id
        self.term = term
        self.replica = replica
        self._publish = publish
        self._wait_committed = wait_committed
        self._queue_limit = queue_limit
        self._reachable = reachable
        """Nodes this master hears now (itself included); re-placement avoids the others."""
        self._heard_ago = heard_ago
        """Seconds since this master last heard a node (None: never); a re-placement waits for
        the failed instance's nodes to be heard again (``master.replace.unconfirmed``)."""
        self._rank_settings = rank_settings
        """What the instances this master places fix for all their ranks (``RankSettings``)."""
        self._restore_size = restore_size
        """Whether this master starts restores of shrunk instances (``master.restore``;
        ``--no-restore-size``); restores under way are finished either way."""
        self._routing = routing
        """How requests are routed among ready instances (``master.routing``; ``--routing``)."""
        self._relink_enabled = relink
        """Whether this master moves idle instances onto much cheaper rings (``master.relink``;
        ``--no-relink``); moves under way are finished either way."""
        self._restore_not_before: dict[str, float] = {}
        self._relink = RelinkClock()
        self._idle = IdleClock()
        """When this master first saw each instance ready (``master.idle``)."""
        self._hub_forget = HubForgetClock(hub_card_idle)
        """Since when each hub model is unused (``master.hub_forget``)."""
        self._lock = trio.Lock()
        self._replacement_errors: set[str] = set()
        """Instances whose re-placement raised (logged once; tried again every pass)."""
        self.origins = OriginSeqs.from_state(replica.state)
        self.counters: dict[str, int] = {"local_event_duplicate": 0, "local_event_gap": 0}

    async def accept_local(self, event: LocalEvent) -> None:
        """Sequence a node's local event if it is the next from its origin."""
        async with self._lock:
            verdict = self.origins.check(event)
            if verdict != "accept":
                self.counters[f"local_event_{verdict}"] += 1
                return
            self.origins.record(event)
            why = refuse_local(self.replica.state, event.origin, event.event)
            if why is not None:
                n = self.counters.get("local_event_refused", 0) + 1
                self.counters["local_event_refused"] = n
                if n == 1:
                    log.warning("local event refused (further ones are only counted)", origin=event.origin, kind=type(event.event).__name__, why=why)
                return
            await self._index([event.event], origin=event)

    async def emit(self, events: list[Event]) -> int:
        """Sequence events the master makes itself; returns the last index."""
        async with self._lock:
            return await self._index(events)

    async def command(self, command: Command) -> CommandResult:
        """Decide and sequence ``command``; answer once its events are committed."""
        async with self._lock:
            try:
                state = self.replica.state
                unreachable = frozenset(state.nodes) - self._reachable() if self._reachable is not None else frozenset()
                decision = handle_command(state, command, queue_limit=self._queue_limit, rank_settings=self._rank_settings,
                                          unreachable=unreachable, routing=self._routing, now=time.time())
            except Exception as exc:  # a rule bug must not take the master down
                log.exception("command failed", command=type(command).__name__)
                return CommandResult(command.command_id, error=ErrorInfo(500, f"internal error handling command: {exc}", "server_error"))
            last = await self._index(list(decision.events)) if decision.events else self.replica.last_idx
            if handed := sum(isinstance(e, InstanceDeleted) for e in decision.events if isinstance(command, PlaceInstance)):
                self.counters["unload_room"] = self.counters.get("unload_room", 0) + handed  # master.handover
        if decision.events and self._wait_committed is not None:
            with trio.move_on_after(10) as scope:
                await self._wait_committed(last)
            if scope.cancelled_caught:
                return CommandResult(
                    command.command_id,
                    error=ErrorInfo(503, "the cluster did not confirm the change within 10 s; retry", "server_error", code="not_committed"),
                )
        return msgspec.structs.replace(decision.result, event_idx=last)

    async def run(self, *, clock=trio.current_time) -> None:
        """Background duties while master: re-place failed instances after their delay
        (``master.replace.replace_delay``) once their nodes are heard again or unreachable
        (``master.replace.unconfirmed``, at most ``CONFIRM_WAIT`` s), and bring shrunk
        instances back to their placed size (``master.restore``), forget the models read from
        a hub that nothing used for ``hub_card_idle`` s (``master.hub_forget``), unload instances
        idle past their keep-alive (``master.idle``). Runs until cancelled
        (when this node stops being master)."""
        from exo_p2p.types import new_id
        from master.replace import CONFIRM_WAIT, effective_attempt, replace_delay, replacement, unconfirmed
        from master.restore import handled_by_restore

        failed_since: dict[str, float] = {}
        while True:
            await trio.sleep(0.25)
            now = clock()
            state = self.replica.state
            failed = {i: inst for i, inst in state.instances.items()
                      if inst.failed_reason is not None and not inst.gave_up and not handled_by_restore(state, inst)}
            for gone in set(failed_since) - set(failed):
                del failed_since[gone]
            for instance_id, inst in sorted(failed.items()):
                since = failed_since.setdefault(instance_id, now)
                if now - since < replace_delay(inst):
                    continue
                async with self._lock:
                    current = self.replica.state.instances.get(instance_id)
                    if current is None or current.gave_up or current.failed_reason is None:
                        continue
                    state = self.replica.state
                    reachable = frozenset(self._reachable()) if self._reachable is not None else frozenset(state.nodes)
                    unreachable = frozenset(state.nodes) - reachable
                    if self._heard_ago is not None and (suspects := unconfirmed(current, reachable, self._heard_ago, now - since)):
                        if now - since < CONFIRM_WAIT:
                            continue  # one of them may be the dead node the failure is about
                        unreachable |= suspects
                    try:
                        events = list(replacement(state, current, new_id(), unreachable=unreachable,
                                                  rank_settings=self._rank_settings, waited=now - since))
                    except Exception:  # a rule bug must not take the master (and the next one) down
                        if instance_id not in self._replacement_errors:
                            log.exception("re-placement failed", instance_id=instance_id)
                        self._replacement_errors.add(instance_id)
                        continue
                    if events:
                        log.info("re-placing failed instance", instance_id=instance_id, attempt=effective_attempt(current) + 1, events=[type(e).__name__ for e in events])
                        await self._index(events)
            await self._restore_pass(clock())
            await self._idle_pass(time.time())
            if forgotten := self._hub_forget.due(self.replica.state, clock()):
                log.info("forgetting models read from a hub that nothing used", models=list(forgotten))
                await self.emit([HubModelsForgotten(forgotten)])

    async def _idle_pass(self, now: float) -> None:
        """Unload the instances idle past their keep-alive (``master.idle``; ``now``: unix s),
        counted per reason in ``counters`` (``unload_idle``)."""
        for instance_id in self._idle.due(self.replica.state, now):
            async with self._lock:
                state = self.replica.state
                if instance_id not in self._idle.due(state, now):
                    continue  # a request started on it meanwhile
                log.info("unloading an idle instance", instance_id=instance_id, usage=state.usage.get(instance_id))
                self.counters["unload_idle"] = self.counters.get("unload_idle", 0) + 1
                await self._index(list(unload_events(state, instance_id, idle_reason(state, instance_id))))

    async def _restore_pass(self, now: float) -> None:
        """One step of ``master.restore.restore_step`` under the lock: finish the restores
        and moves under way, else start at most one restore (when ``restore_size``); when
        none is under way nor started, one check of ``master.relink`` (``_relink_pass``)."""
        from exo_p2p.types import new_id
        from master.restore import restore_step, restore_under_way

        async with self._lock:
            state = self.replica.state
            reachable = frozenset(self._reachable()) if self._reachable is not None else frozenset(state.nodes)
            if any(i.shrunk or i.restores for i in state.instances.values()):
                try:
                    plan = restore_step(state, reachable=reachable, now=now, not_before=self._restore_not_before,
                                        new_instance_id=new_id(), start=self._restore_size)
                except Exception:  # a rule bug must not take the master down
                    log.exception("restore of a shrunk instance failed")
                    return
                if plan.instance_id is not None:
                    self._restore_not_before[plan.instance_id] = now + plan.wait
                if plan.why:
                    log.debug("shrunk instance not restored yet", instance_id=plan.instance_id, why=plan.why)
                if plan.events and plan.instance_id is not None:
                    log.info("restoring the placed size", instance_id=plan.instance_id, events=[type(e).__name__ for e in plan.events])
                elif plan.events:  # master.restore's switch, for a restore or a move (master.relink)
                    log.info("switching to the successor, or dropping it", deleted=[getattr(e, "instance_id", None) for e in plan.events])
                if plan.events:
                    await self._index(list(plan.events))
                if plan.events or restore_under_way(self.replica.state):
                    return  # one restore or move at a time
            if self._relink_enabled:
                await self._relink_pass(state, reachable, now)

    async def _relink_pass(self, state: State, reachable: frozenset[str], now: float) -> None:
        """One check of ``master.relink`` (at most every ``RELINK_CHECK_EVERY`` s), under the
        lock, when no restore or move is under way: start at most one move of an idle
        instance onto a cheaper ring, and say why in the log and in the successor (``moved``)."""
        from exo_p2p.types import new_id
        from master.relink import relink_step

        if not self._relink.due(now):
            return
        try:
            plan = relink_step(state, reachable=reachable, now=now, not_before=self._relink.not_before,
                               better_since=self._relink.better_since, new_instance_id=new_id())
        except Exception:  # a rule bug must not take the master down
            log.exception("check for a cheaper ring failed")
            return
        self._relink.checked(now, plan)
        if plan.move is not None:
            move = plan.move
            log.info("moving an idle instance to a cheaper ring", instance_id=move.instance_id,
                     successor=move.successor.instance_id, current_us_per_token=move.current_us,
                     best_us_per_token=move.best_us, why=move.why)
            await self._index(list(plan.events))

    async def _index(self, events: list[Event], origin: LocalEvent | None = None) -> int:
        pending = list(events)
        first = True
        while pending:
            event = pending.pop(0)
            idx = self.replica.last_idx + 1
            if isinstance(event, TaskCreated):
                event = TaskCreated(msgspec.structs.replace(event.task, created_idx=idx))
            indexed = IndexedEvent(
                term=self.term,
                idx=idx,
                event=event,
                origin=origin.origin if (origin and first) else "",
                origin_boot=origin.origin_boot if (origin and first) else "",
                origin_seq=origin.origin_seq if (origin and first) else 0,
            )
            first = False
            self.replica.offer(indexed)
            await self._publish(indexed)
            pending.extend(react(self.replica.state, event))
        return self.replica.last_idx
