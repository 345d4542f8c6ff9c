"""This node's part in the cluster: heartbeats, election, log replication, routing.

``ClusterMember`` runs over the libp2p ``Network`` and the node's ``Replica``. It knows
nothing of placement or runners: the node (composition root) injects the master role
through ``MasterHooks`` (start/stop sequencing, accept a local event, decide a command).

Guarantees (design.md §4, §5a, §5c):
- every local event is re-sent until this node applies it back indexed (per-origin
  sequence numbers let the master drop duplicates);
- indexed events are accepted only from the node this node follows as master, applied in
  order, gaps fetched over a direct stream (resuming from the last applied index; a
  snapshot when the range was compacted or this node's tail diverged);
- a peer is gone after ``peer_timeout`` seconds without a heartbeat (gossiped, or sent to
  the master over a direct stream: ``direct_heartbeat``), by this node's monotonic clock;
  the master then records ``NodeTimedOut``, never before a full timeout of its mastership
  (``peer_timeouts``);
- a master is elected by ``election.decide`` over the claims ``claims`` admits; a new
  master first fetches events that live peers applied and it lacks;
- commands are decided only for members (``command_access``);
- commands reach the master over a request/response stream, retried across a failover,
  and are answered only once committed (applied by another node, or persisted when alone).
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec
import structlog
import trio

from exo_p2p.cluster.command_access import NOT_MEMBER, command_refusal
from exo_p2p.cluster.claims import ClaimChecker, ClaimStatus, ProbeAnswer, probe_answer
from exo_p2p.cluster.direct_heartbeat import DirectHeartbeats
from exo_p2p.cluster.election import ElectionView, decide, support
from exo_p2p.cluster.event_times import EventTimes
from exo_p2p.cluster.faults import HOOK_HEARTBEAT_GOSSIP_OFF, FaultyReceiver, gossip_faults_from_hooks, hold_from_hooks
from exo_p2p.cluster.liveness import Liveness
from exo_p2p.cluster.peer_timeouts import timed_out
from exo_p2p.cluster.messages import (
    CHUNKS_PROTOCOL,
    COMMAND_PROTOCOL,
    GLOBAL_EVENTS_TOPIC,
    HEARTBEAT_PROTOCOL,
    HEARTBEATS_TOPIC,
    LOCAL_EVENTS_PROTOCOL,
    LOCAL_EVENTS_TOPIC,
    LOG_PROTOCOL,
    ChunkBatch,
    Heartbeat,
    IndexedEventBatch,
    LocalEventBatch,
    LogRequest,
    LogResponse,
    chunk_batch_decoder,
    decode_global,
    encode,
    heartbeat_decoder,
    local_batch_decoder,
    log_request_decoder,
    log_response_decoder,
)
from exo_p2p.replica import Replica
from exo_p2p.types import (
    PROTOCOL_VERSION,
    Chunk,
    Command,
    CommandEnvelope,
    CommandResult,
    ErrorInfo,
    Event,
    IndexedEvent,
    LocalEvent,
    NodeTimedOut,
    State,
    TopologyEdge,
    TopologyEdgeCreated,
    TopologyEdgeDeleted,
)

log = structlog.get_logger(__name__)

_command_env_decoder = msgspec.msgpack.Decoder(CommandEnvelope)
_command_result_decoder = msgspec.msgpack.Decoder(CommandResult)


_ROUTINE_DROPS = frozenset({"global_event_not_from_master", "global_event_duplicate", "global_event_stale_term"})
"""Drop kinds expected while joining or after a master change: logged at info, not warning."""


@dataclass
class ClusterSettings:
    """Timings in seconds (design.md §5c)."""

    heartbeat_interval: float = 0.5
    peer_timeout: float = 5.0
    settle: float = 2.0
    """Seconds a node without a master waits after it starts before an election (so the
    heartbeats of an existing master can reach it first)."""
    known_settle: float = 5.0
    """``settle`` for a node that starts with other nodes in its State (see ``_start_settle``)."""
    failover_settle: float = 0.5
    """Seconds to wait after losing a master before electing (every node decides alike)."""
    disconnect_grace: float = 1.0
    """A master whose last connection closed is gone after this many seconds unless it
    reconnects (a killed process is noticed in ~0.2 s; a brief hiccup is tolerated)."""
    resend_interval: float = 1.0
    command_timeout: float = 30.0
    request_timeout: float = 10.0
    max_local_batch: int = 64
    max_global_batch: int = 64
    """Indexed events per gossip message at most (a burst is published as one message)."""
    max_outbox: int = 4096
    """Indexed events waiting to be published at most; beyond it the master's sequencing waits."""
    fault_hooks: dict[str, str] = field(default_factory=dict)
    """Tests only (``--fault-hook``): ``gossip_drop``/``gossip_dup``/``gossip_reorder`` mistreat
    the messages this node receives on the local- and global-events topics (``cluster.faults``)."""


@dataclass
class MasterHooks:
    """The master role as the cluster drives it (implemented by the node with ``master``)."""

    start: Callable[[int], Awaitable[None]]
    """Become master with this term (sequence ``MasterElected`` first)."""
    stop: Callable[[], Awaitable[None]]
    """Stop sequencing (another master won)."""
    accept_local: Callable[[LocalEvent], Awaitable[None]]
    command: Callable[[Command], Awaitable[CommandResult]]
    emit: Callable[[list[Event]], Awaitable[int]]


class DuplicateIdentityError(RuntimeError):
    """Another running node uses this node's identity (a copied data dir)."""


class ClusterMember:
    def __init__(
        self,
        net,  # exo_p2p.net.Network
        replica: Replica,
        node_id: str,
        boot_id: str,
        hooks: MasterHooks,
        *,
        priority: int = 0,
        settings: ClusterSettings | None = None,
        on_chunks: Callable[[str, list[Chunk], list[int]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.net = net
        self.replica = replica
        self.node_id = node_id
        self.boot_id = boot_id
        self.hooks = hooks
        self.priority = priority
        self.s = settings or ClusterSettings()
        self.clock = clock
        self.liveness = Liveness(self.s.peer_timeout)
        self.master: str | None = None
        self.term = replica.state.term
        self.is_master = False
        self._masterless_since: float | None = clock()
        self._started_at = clock()
        self._master_since = clock()
        """When this node last became master (the timeout grace of ``peer_timeouts``)."""
        self._gossip_heard_at: dict[str, float] = {}
        self.claims = ClaimChecker()
        self.direct = DirectHeartbeats(
            net,
            own=self.own_heartbeat,
            master=lambda: None if self.is_master else self.master,
            on_heartbeat=self._on_heartbeat,
            gossip_heard_at=self._gossip_heard_at.get,
            clock=clock,
            heartbeat_interval=self.s.heartbeat_interval,
            peer_timeout=self.s.peer_timeout,
            count=self._count,
            tally=lambda kind: self.counters.__setitem__(kind, self.counters.get(kind, 0) + 1),
        )
        self._seq = 0
        self._pending: dict[int, LocalEvent] = {}
        self._sent_at: dict[int, float] = {}
        self._pending_wake = trio.Event()
        self._outbox: list[IndexedEvent] = []
        self._outbox_wake = trio.Event()
        self._outbox_room = trio.Event()
        self._beat_now = trio.Event()
        self._heard = trio.Event()
        self._sync_wake = trio.Event()
        self._master_changed = trio.Event()
        self._on_chunks = on_chunks
        self._chunk_queues: dict[str, trio.MemorySendChannel[tuple[Chunk, int]]] = {}
        self._disconnected_at: dict[str, float] = {}
        self._edges_announced: set[str] = set()
        self._announcing: set[str] = set()
        self._known_at_boot = frozenset(replica.state.nodes)
        self._nursery: trio.Nursery | None = None
        self.counters: dict[str, int] = {}
        self.duplicate_identity: str | None = None
        self._role_lock = trio.Lock()
        self._epoch = 0
        self.event_times = EventTimes(node_id, clock=time.monotonic)
        # first listener: the apply time is taken before other listeners run
        replica.listeners.insert(0, lambda e, _s: self.event_times.applied(e.idx))
        replica.listeners.append(self._on_applied)
        replica.snapshot_listeners.append(self._on_log_replaced)

    # --- small helpers ----------------------------------------------------------------
    def _count(self, kind: str) -> None:
        """Count a dropped message of ``kind``; the first of each kind is logged."""
        n = self.counters.get(kind, 0) + 1
        self.counters[kind] = n
        if n == 1:
            # drops that happen in normal operation (gossip from the master arriving before
            # this node follows it, a duplicate relayed by two peers) are not warnings
            level = log.debug if kind in _ROUTINE_DROPS else log.warning
            level("message dropped (further drops of this kind are only counted)", kind=kind)

    def own_heartbeat(self) -> Heartbeat:
        last = self.replica.last_idx
        commit_idx, followers = last, 0
        if self.is_master:
            following = [p for p in self.live_peers() if p.master == self.node_id]
            followers = len(following)
            if following:  # committed: applied by a live follower (else persisted here, alone)
                commit_idx = min(last, max(p.last_idx for p in following))
        return Heartbeat(
            node_id=self.node_id,
            boot_id=self.boot_id,
            term=self.term,
            master=self.master,
            priority=self.priority,
            last_idx=last,
            last_term=self.replica.last_term,
            commit_idx=commit_idx,
            followers=followers,
            chain=(self.replica.chain_at(last) or b"") if last else b"",
        )

    def reachable_nodes(self) -> set[str]:
        """This node and every peer it hears now (live heartbeat, connection not lost)."""
        now = self.clock()
        return {self.node_id, *(p.node_id for p in self.live_peers() if not self._disconnected_for(p.node_id, now))}

    def alone_for(self) -> float | None:
        """Seconds this node has had no connected peer — since it started, or since its last
        peer left — or None while it has one."""
        if self.net.connected_peers():
            return None
        return self.clock() - max([self._started_at, *self._disconnected_at.values()])

    def live_peers(self) -> list[Heartbeat]:
        return [hb for hb in self.liveness.alive(self.clock()) if hb.node_id != self.node_id]

    def last_seen(self, node_id: str) -> float | None:
        """Seconds since the last heartbeat of ``node_id`` (0 for this node)."""
        if node_id == self.node_id:
            return 0.0
        t = self.liveness.last_heard(node_id)
        return None if t is None else max(0.0, self.clock() - t)

    # --- running ------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.net.set_request_handler(LOG_PROTOCOL, self._serve_log)
        self.net.set_request_handler(COMMAND_PROTOCOL, self._serve_command, timeout=self.s.command_timeout + 5)
        self.net.set_request_handler(CHUNKS_PROTOCOL, self._serve_chunks)
        self.net.set_request_handler(HEARTBEAT_PROTOCOL, self.direct.serve)
        self.net.set_request_handler(LOCAL_EVENTS_PROTOCOL, self._serve_local_events)
        heartbeats = await self.net.subscribe(HEARTBEATS_TOPIC, include_own=True, buffer=4096)
        local_events = self._with_faults(await self.net.subscribe(LOCAL_EVENTS_TOPIC, buffer=4096), LOCAL_EVENTS_TOPIC)
        global_events = self._with_faults(await self.net.subscribe(GLOBAL_EVENTS_TOPIC, buffer=8192), GLOBAL_EVENTS_TOPIC)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._heartbeat_loop)
            nursery.start_soon(self.direct.run)
            nursery.start_soon(self._receive_heartbeats, heartbeats)
            nursery.start_soon(self._receive_local_events, local_events)
            nursery.start_soon(self._receive_global_events, global_events)
            nursery.start_soon(self._election_loop)
            nursery.start_soon(self._resend_loop)
            nursery.start_soon(self._publish_loop)
            nursery.start_soon(self._sync_loop)
            nursery.start_soon(self._timeout_loop)
            nursery.start_soon(self._topology_loop)
            nursery.start_soon(self._mesh_loop)
            nursery.start_soon(self._edge_reconcile_loop)
            task_status.started()

    def _with_faults(self, channel, topic: str):  # type: ignore[no-untyped-def]
        """Tests only: ``channel`` with the gossip faults of ``settings.fault_hooks`` applied
        (counted ``fault_dropped:<topic>``, ``fault_duplicated:<topic>``,
        ``fault_reordered:<topic>``); ``channel`` itself when no such hook is set."""
        faults = gossip_faults_from_hooks(self.s.fault_hooks, topic)
        if faults is None:
            return channel
        log.warning("gossip fault injection on (tests only)", topic=topic, drop=faults.drop, dup=faults.dup, reorder=faults.reorder)

        def count(kind: str, n: int) -> None:
            key = f"fault_{kind}:{topic}"
            self.counters[key] = self.counters.get(key, 0) + n

        return FaultyReceiver(channel, faults, hold=hold_from_hooks(self.s.fault_hooks), on_count=count)

    # --- heartbeats and liveness -----------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        gossip = self.s.fault_hooks.get(HOOK_HEARTBEAT_GOSSIP_OFF) is None
        if not gossip:
            log.warning("heartbeat gossip off (tests only): heartbeats go over direct streams only")
        last_sent = -math.inf
        while True:
            with trio.move_on_after(self.s.heartbeat_interval):
                await self._beat_now.wait()
            self._beat_now = trio.Event()
            wait = 0.1 - (self.clock() - last_sent)  # at most 10 heartbeats/s (gossip is ~4 ms CPU per receiver)
            if wait > 0:
                await trio.sleep(wait)
            if gossip:
                await self.net.publish(HEARTBEATS_TOPIC, encode(self.own_heartbeat()))
            last_sent = self.clock()

    async def _receive_heartbeats(self, channel) -> None:  # type: ignore[no-untyped-def]
        async for sender, data in channel:
            try:
                hb = heartbeat_decoder.decode(data)
            except msgspec.DecodeError:
                self._count("heartbeat_undecodable")
                continue
            if hb.version != PROTOCOL_VERSION:
                self._count("heartbeat_version")
                continue
            if hb.node_id != sender:
                self._count("heartbeat_forged")
                continue
            if hb.node_id == self.node_id:
                if hb.boot_id != self.boot_id:
                    self._duplicate(hb)
                continue
            self._gossip_heard_at[hb.node_id] = self.clock()
            self._on_heartbeat(hb)

    def _on_heartbeat(self, hb: Heartbeat) -> None:
        """Record a peer's heartbeat, received by gossip or over a direct stream."""
        if hb.node_id == self.node_id:
            return
        self._heard.set()
        self._heard = trio.Event()
        if self.liveness.heard(hb, self.clock()):
            log.info("peer up", peer=hb.node_id, master=hb.master, term=hb.term, last_idx=hb.last_idx)
            self._beat_now.set()
        if hb.node_id == self.master and hb.last_idx > self.replica.last_idx:
            self._sync_wake.set()

    def _duplicate(self, hb: Heartbeat) -> None:
        if self.duplicate_identity is None:
            self.duplicate_identity = (
                f"another running node uses this node's identity {self.node_id} (boot {hb.boot_id}); "
                "a copied data dir? start one of them with --new-identity"
            )
            log.error("duplicate identity: refusing to join", detail=self.duplicate_identity)
            if self._nursery is not None:
                self._nursery.cancel_scope.cancel()

    # --- election ------------------------------------------------------------------------------
    async def _election_loop(self) -> None:
        while True:
            now = self.clock()
            # a peer with no connection for ``disconnect_grace`` s is gone, even while its
            # last heartbeat is younger than ``peer_timeout`` (a killed master is noticed in
            # ~1.2 s, not 5 s; its stale claim must not hold up the election)
            peers = [p for p in self.live_peers() if not self._disconnected_for(p.node_id, now)]
            # only admitted claims take part (``cluster.claims``): a claimer refused, or whose
            # log is being probed, is left out (a pending one still holds off an election)
            peers, pending = self._admitted(peers, now)
            # the followed master is alive while its heartbeat is live AND still claims: a
            # master that stepped down (or restarted within the disconnect grace) beats on
            # without claiming, and following it would wait forever
            master_alive = self.master == self.node_id or any(p.node_id == self.master and p.master == p.node_id for p in peers)
            if self.master is not None and not master_alive:
                log.warning("master gone", master=self.master)
                await self._set_master(None, self.term)
            claims = [p for p in peers if p.master == p.node_id] + pending
            if self.master is None and not claims and self._masterless_since is None:
                self._masterless_since = now
            since = now if self._masterless_since is None else self._masterless_since
            masterless_for = 0.0 if (claims or self.master is not None) else now - since
            settle = self._start_settle() if now - self._started_at < 2 * self._start_settle() else self.s.failover_settle
            decision = decide(ElectionView(self.own_heartbeat(), tuple(peers), masterless_for), settle=settle)
            if decision.claim:
                await self._claim(decision.term, peers)
            elif decision.follow is not None and (decision.follow != self.master or decision.term != self.term):
                if decision.follow != self.node_id:
                    await self._set_master(decision.follow, decision.term)
            await trio.sleep(0.1)

    def _admitted(self, peers: list[Heartbeat], now: float) -> tuple[list[Heartbeat], list[Heartbeat]]:
        """``peers`` without the master claims ``cluster.claims`` does not admit (yet), and
        the pending claims (a probe of the claimer's log in flight or starting now)."""
        everyone = [self.own_heartbeat(), *peers]
        out: list[Heartbeat] = []
        pending: list[Heartbeat] = []
        for p in peers:
            if p.master != p.node_id:
                out.append(p)
                continue
            status = self.claims.status(
                p,
                side=support(everyone, p.node_id),
                following=(self.master, self.term),
                own_last_idx=self.replica.last_idx,
                own_term=max(self.term, self.replica.last_term),
                chain_at=self.replica.chain_at,
                now=now,
            )
            if status is ClaimStatus.ADMITTED:
                out.append(p)
            elif status is ClaimStatus.REFUSED:
                self._count("master_claim_refused")
            else:
                pending.append(p)
                if status is ClaimStatus.PROBE and self._nursery is not None:
                    self.claims.probe_started(p)
                    self._nursery.start_soon(self._probe_claim, p)
        return out, pending

    async def _probe_claim(self, claim: Heartbeat) -> None:
        """Ask a claimer for the events after our last index (``cluster.claims`` rule 3)."""
        last = self.replica.last_idx
        request = LogRequest(
            from_idx=last + 1, max_events=1, prev_idx=last, prev_term=self.replica.last_term, prev_chain=self.replica.chain_at(last) or b""
        )
        response = None
        try:
            with trio.fail_after(3.0):
                raw = await self.net.request(claim.node_id, LOG_PROTOCOL, encode(request), timeout=3.0)
            response = log_response_decoder.decode(raw)
        except Exception as exc:  # noqa: BLE001 - no answer: refused (re-checked later)
            log.debug("claim probe failed", claimer=claim.node_id, error=repr(exc))
        finally:
            answer = probe_answer(response)
            self.claims.probe_done(claim, answer, self.clock())
        if answer is not ProbeAnswer.EXTENDS:
            log.info("master claim probed", claimer=claim.node_id, term=claim.term, answer=answer.value)

    def _start_settle(self) -> float:
        """Seconds to wait for a master after start: ``settle``, or ``known_settle`` when
        State lists other nodes (this node was in a cluster: it must give its dials to their
        known addresses time before it may claim, else a restarted node that reaches nobody
        within ``settle`` claims the term the others may have just used)."""
        others = any(n != self.node_id for n in self.replica.state.nodes)
        return max(self.s.settle, self.s.known_settle) if others else self.s.settle

    def _disconnected_for(self, peer: str | None, now: float) -> bool:
        """Whether ``peer`` has had no connection for ``disconnect_grace`` seconds."""
        if peer is None:
            return False
        since = self._disconnected_at.get(peer)
        return since is not None and now - since >= self.s.disconnect_grace

    async def _claim(self, term: int, peers: list[Heartbeat] | None = None) -> None:
        """Become master: fetch what live peers (``peers``: those the election considered,
        not a refused claimer) applied that we lack, then sequence."""
        candidates = self.live_peers() if peers is None else peers
        best = max(candidates, key=lambda p: p.last_idx, default=None)
        if best is not None and best.last_idx > self.replica.last_idx:
            await self._fetch_from(best.node_id)
            if self.replica.last_idx < best.last_idx:
                return  # could not catch up yet; try again next round
        async with self._role_lock:
            self.term = max(term, self.replica.state.term + 1)
            self.master = self.node_id
            self.is_master = True
            self._master_since = self.clock()
            self.replica.defer_sync = True  # group commit: synced before anything leaves
            self._masterless_since = None
            log.info("became master", term=self.term, last_idx=self.replica.last_idx)
            await self.hooks.start(self.term)
        self._signal_master_change()

    async def _set_master(self, master: str | None, term: int) -> None:
        async with self._role_lock:
            if self.is_master and master != self.node_id:
                log.warning("stepping down", new_master=master, term=term)
                self.is_master = False
                await self.hooks.stop()
                self.replica.defer_sync = False
                self.replica.sync()
            if master != self.master:
                log.info("following master", master=master, term=term)
            self.master = master
            # a follower takes its master's term, even a lower one: the winner of a healed
            # partition may have the lower term (``election.master_rank``), and its events
            # must not look stale here
            self.term = term if master is not None else self.term
            self._masterless_since = None if master is not None else self.clock()
        self._signal_master_change()
        if master is not None:
            self._sync_wake.set()

    def _signal_master_change(self) -> None:
        self._master_changed.set()
        self._master_changed = trio.Event()
        self._sent_at.clear()  # the new master may not have seen any of them
        self._pending_wake.set()
        self._beat_now.set()

    async def wait_for_master(self, timeout: float) -> str | None:
        with trio.move_on_after(timeout):
            while self.master is None:
                await self._master_changed.wait()
        return self.master

    # --- local events -------------------------------------------------------------------------
    @property
    def origin_boot(self) -> str:
        """The origin key our local events carry: the boot id, plus an epoch after our log
        was replaced (a snapshot installed, a divergent tail dropped)."""
        return self.boot_id if self._epoch == 0 else f"{self.boot_id}.{self._epoch}"

    @property
    def local_events_pending(self) -> int:
        """How many local events were sent to the master and not yet seen indexed."""
        return len(self._pending)

    def send_local(self, event: Event) -> None:
        """Queue a local event for the master; re-sent until seen indexed."""
        self._seq += 1
        self._pending[self._seq] = LocalEvent(self.node_id, self.origin_boot, self._seq, event)  # type: ignore[arg-type]
        self._pending_wake.set()

    def _on_log_replaced(self, _state: State) -> None:
        """Our log was replaced by another master's: events of ours that we applied in the
        dropped log may be unknown to that master, whose de-duplication table then waits
        for sequence numbers that will never come. Start a new origin epoch (sequence
        numbers from 1 again) and re-send what is still pending under it; the node
        re-publishes its profile and edges when State lacks them."""
        pending = [self._pending[s].event for s in sorted(self._pending)]
        self._epoch += 1
        self._seq = 0
        self._pending = {}
        self._sent_at = {}
        for event in pending:
            self.send_local(event)
        log.info("log replaced; new origin epoch", epoch=self._epoch, resent=len(pending))
        self._edges_announced.clear()
        if self._nursery is not None:
            for peer in self.net.connected_peers():
                self._nursery.start_soon(self._announce_edge, peer)

    def _on_applied(self, event: IndexedEvent, _state: State) -> None:
        if event.origin == self.node_id and event.origin_boot == self.origin_boot:
            for seq in [s for s in self._pending if s <= event.origin_seq]:
                del self._pending[seq]
                self._sent_at.pop(seq, None)
        if not self.is_master:
            self._beat_now.set()  # tells the master promptly that we applied (commit rule)

    async def _resend_loop(self) -> None:
        """Deliver pending local events: directly when we are master, else by gossip. A new
        event goes out at once (only the new ones: re-sending every pending event whenever
        one more is queued made O(n²) gossip under bursts); one not seen indexed
        ``resend_interval`` seconds after it was last sent goes out again, and all of them
        after a master change. A first send goes by gossip; a re-send goes over a direct
        stream to the master (gossip when that fails), so a node that GossipSub keeps out of
        the master's mesh for a while (a restarted node) still gets its events indexed."""
        while True:
            with trio.move_on_after(self.s.resend_interval / 2):
                await self._pending_wake.wait()
            self._pending_wake = trio.Event()
            if not self._pending or self.master is None:
                continue
            now = self.clock()
            due = [
                self._pending[s]
                for s in sorted(self._pending)
                if now - self._sent_at.get(s, -math.inf) >= self.s.resend_interval
            ]
            if not due:
                continue
            retries = [local for local in due if local.origin_seq in self._sent_at]
            for local in due:
                self._sent_at[local.origin_seq] = now
            if self.is_master:
                for local in due:
                    await self.hooks.accept_local(local)
                continue
            gossip = [local for local in due if local.origin_seq not in {r.origin_seq for r in retries}]
            if retries and not await self._send_local_direct(retries):
                gossip = due
            for i in range(0, len(gossip), self.s.max_local_batch):
                batch = LocalEventBatch(tuple(gossip[i : i + self.s.max_local_batch]))
                await self.net.publish(LOCAL_EVENTS_TOPIC, encode(batch))

    async def _send_local_direct(self, events: list[LocalEvent]) -> bool:
        """Send re-sent local events to the master over a direct stream; False when it
        did not take them (unreachable, or no longer master)."""
        master = self.master
        if master is None:
            return False
        try:
            for i in range(0, len(events), self.s.max_local_batch):
                batch = LocalEventBatch(tuple(events[i : i + self.s.max_local_batch]))
                reply = await self.net.request(master, LOCAL_EVENTS_PROTOCOL, encode(batch), timeout=min(3.0, self.s.request_timeout))
                if reply != b"ok":
                    return False
        except Exception as exc:  # noqa: BLE001 - fall back to gossip
            log.debug("direct local events failed", master=master, error=repr(exc))
            self._count("local_events_direct_failed")
            return False
        self.counters["local_events_direct"] = self.counters.get("local_events_direct", 0) + len(events)
        return True

    async def _serve_local_events(self, peer: str, data: bytes) -> bytes:
        """As master: accept a peer's re-sent local events (its own only)."""
        batch = local_batch_decoder.decode(data)
        if batch.version != PROTOCOL_VERSION:
            raise ValueError(f"unsupported protocol version {batch.version}")
        if not self.is_master:
            return b"not_master"
        for local in batch.events:
            if local.origin != peer or local.version != PROTOCOL_VERSION:
                self._count("local_event_forged")
                continue
            await self.hooks.accept_local(local)
        return b"ok"

    async def _receive_local_events(self, channel) -> None:  # type: ignore[no-untyped-def]
        async for sender, data in channel:
            if not self.is_master:
                continue
            try:
                batch = local_batch_decoder.decode(data)
            except msgspec.DecodeError:
                self._count("local_event_undecodable")
                continue
            if batch.version != PROTOCOL_VERSION:
                self._count("local_event_version")
                continue
            for local in batch.events:
                if local.origin != sender or local.version != PROTOCOL_VERSION:
                    self._count("local_event_forged")
                    continue
                await self.hooks.accept_local(local)

    # --- global events and log sync ---------------------------------------------------------------
    async def publish_indexed(self, indexed: IndexedEvent) -> None:
        """As master: queue ``indexed`` (already applied here) for gossip; the publish loop
        fsyncs the log before the message leaves (one fsync per message).

        Returns at once unless ``max_outbox`` events are waiting (then it waits for room):
        the events the master sequences in one go (a command and its reactions) leave as one
        ``IndexedEventBatch`` message, and the master's sequencing never waits for gossip.
        The probe's publish time is taken here, so time spent in the outbox counts as
        publish→apply latency."""
        self.event_times.published(indexed.idx)
        while len(self._outbox) >= self.s.max_outbox:
            await self._outbox_room.wait()
        self._outbox.append(indexed)
        self._outbox_wake.set()

    async def _publish_loop(self) -> None:
        """Publish the outbox in index order, up to ``max_global_batch`` events a message
        (halved while a message would exceed the gossip payload limit)."""
        while True:
            await self._outbox_wake.wait()
            self._outbox_wake = trio.Event()
            while self._outbox:
                n = min(len(self._outbox), self.s.max_global_batch)
                data = encode(IndexedEventBatch(tuple(self._outbox[:n])))
                while n > 1 and len(data) > self.net.max_payload_bytes:
                    n //= 2
                    data = encode(IndexedEventBatch(tuple(self._outbox[:n])))
                del self._outbox[:n]
                self._outbox_room.set()
                self._outbox_room = trio.Event()
                self.replica.sync()  # persisted before any other node can see it (§5a)
                # one event too large for gossip is dropped by publish (counted); followers
                # fetch it over a stream when they see the gap or the master's heartbeat
                await self.net.publish(GLOBAL_EVENTS_TOPIC, data)

    async def _receive_global_events(self, channel) -> None:  # type: ignore[no-untyped-def]
        async for sender, data in channel:
            try:
                batch = decode_global(data)
            except msgspec.DecodeError:
                self._count("global_event_undecodable")
                continue
            if batch.version != PROTOCOL_VERSION or any(e.version != PROTOCOL_VERSION for e in batch.events):
                self._count("global_event_version")
                continue
            if sender != self.master or self.is_master:
                self._count("global_event_not_from_master")
                continue
            fresh = [e for e in batch.events if e.term >= self.term]
            if len(fresh) < len(batch.events):
                self._count("global_event_stale_term")
            for e in fresh:
                if e.idx > self.replica.last_idx:
                    self.event_times.received(e.idx)
            outcomes = self.replica.offer_many(fresh)
            if "buffered" in outcomes:
                self._sync_wake.set()
            if "duplicate" in outcomes:
                self._count("global_event_duplicate")

    async def _sync_loop(self) -> None:
        while True:
            with trio.move_on_after(1.0):
                await self._sync_wake.wait()
            self._sync_wake = trio.Event()
            master = self.master
            if master is None or self.is_master:
                continue
            hb = self.liveness.get(master)
            behind = hb is not None and hb.last_idx > self.replica.last_idx
            if behind or self.replica.missing_range() is not None or self._needs_check(master):
                if await self._fetch_from(master):
                    continue
                # the master is not reachable by a direct stream (gossip can still reach us
                # through other peers): fetch from a peer that follows the same master in the
                # same term, the most advanced first
                same = sorted(
                    (p for p in self.live_peers() if p.master == master and p.term == self.term and p.node_id != master),
                    key=lambda p: -p.last_idx,
                )
                for peer in same[:3]:
                    if await self._fetch_from(peer.node_id):
                        break

    def _needs_check(self, master: str) -> bool:
        # after following a new master, check once that our tail agrees with its log
        return getattr(self, "_checked_master", None) != (master, self.term)

    async def _fetch_from(self, peer: str) -> bool:
        """Fetch events after our last index from ``peer`` (the master, or a peer following
        it) until caught up, installing its snapshot when our tail diverged from its log.
        Returns False when the exchange failed (peer unreachable, bad answer)."""
        master = self.master
        for _ in range(1000):
            last = self.replica.last_idx
            request = LogRequest(
                from_idx=last + 1,
                prev_idx=last,
                prev_term=self.replica.last_term,
                prev_chain=self.replica.chain_at(last) or b"",
            )
            try:
                with trio.fail_after(self.s.request_timeout):
                    raw = await self.net.request(peer, LOG_PROTOCOL, encode(request), timeout=self.s.request_timeout)
                response = log_response_decoder.decode(raw)
            except (trio.TooSlowError, msgspec.DecodeError, Exception) as exc:  # noqa: BLE001
                log.warning("log fetch failed", peer=peer, error=repr(exc))
                self._count("log_fetch_failed")
                return False
            if response.snapshot is not None:
                log.info("installing snapshot", peer=peer, idx=response.snapshot.last_event_idx)
                self.replica.install_snapshot(response.snapshot, response.snapshot_chain or None)
            before = self.replica.last_idx
            self.replica.offer_many(list(response.events))
            if self.replica.last_idx > before:  # gaps recovered by fetch, not gossip (B12)
                self.counters["log_fetch_applied"] = self.counters.get("log_fetch_applied", 0) + self.replica.last_idx - before
            self._checked_master = (master, self.term)
            if not response.events and response.snapshot is None:
                return True
            if self.replica.last_idx >= response.last_idx:
                return True
        return True

    async def _serve_log(self, peer: str, data: bytes) -> bytes:
        request = log_request_decoder.decode(data)
        r = self.replica
        r.sync()  # what we serve is persisted here first (the master defers its fsyncs)
        diverged = tail_diverged(r, request)
        snapshot = LogResponse(snapshot=r.state, last_idx=r.last_idx, snapshot_chain=r.chain_at(r.last_idx) or b"")
        if diverged:
            return encode(LogResponse(snapshot=r.state, last_idx=r.last_idx, snapshot_chain=snapshot.snapshot_chain, diverged=True))
        events = r.events_from(request.from_idx, min(request.max_events, 5000))
        if events is None:
            return encode(snapshot)
        return encode(LogResponse(events=tuple(events), last_idx=r.last_idx))

    # --- master duties -----------------------------------------------------------------------
    async def _timeout_loop(self) -> None:
        """As master: time out nodes in State not heard from for ``peer_timeout`` seconds."""
        while True:
            await trio.sleep(0.5)
            if not self.is_master:
                continue
            now = self.clock()
            gone = timed_out(
                list(self.replica.state.nodes),
                self_id=self.node_id,
                last_heard=self.liveness.last_heard,
                master_since=max(self._master_since, self._started_at),
                now=now,
                timeout=self.s.peer_timeout,
            )
            for node_id in gone:
                log.warning("node timed out", node=node_id)
                await self.hooks.emit([NodeTimedOut(node_id)])  # type: ignore[arg-type]

    async def wait_committed(self, idx: int) -> None:
        """Return once event ``idx`` is committed (design.md §5a): applied by some other
        live node (followers fsync before they apply and report it in their heartbeat), or,
        when this node is alone, once persisted (the master's deferred fsync is done here).
        Woken by every heartbeat received, checked at least every 50 ms."""
        while True:
            peers = self.live_peers()
            if not peers:
                self.replica.sync()  # alone: committed once persisted
                return
            if any(p.last_idx >= idx for p in peers):
                return
            with trio.move_on_after(0.05):
                await self._heard.wait()

    # --- topology ---------------------------------------------------------------------------
    async def _mesh_loop(self) -> None:
        """Connect to every node in State this node is not connected to (their profiles carry
        their addresses), so the cluster is a full mesh: direct streams (commands, chunks,
        log sync) reach any peer, and topology edges exist for every reachable pair.
        Each node is tried at most every ``backoff`` seconds (doubling to 30 s)."""
        next_try: dict[str, tuple[float, float]] = {}
        while True:
            await trio.sleep(0.5)
            connected = self.net.connected_peers()
            now = self.clock()
            for node_id, profile in list(self.replica.state.nodes.items()):
                if node_id == self.node_id or node_id in connected:
                    next_try.pop(node_id, None)
                    continue
                # nodes this node knew before it started are dialled at once: they cannot
                # dial us (we may listen on a new port) and our election waits for them
                stagger = 0.0 if self.node_id < node_id or node_id in self._known_at_boot else 3.0
                when, backoff = next_try.get(node_id, (now + stagger, 0.5))
                if node_id not in next_try:
                    # the smaller id dials; the other waits 3 s first, so a pair does not
                    # open two connections at once (one of which libp2p then closes)
                    next_try[node_id] = (when, backoff)
                if now < when:
                    continue
                next_try[node_id] = (now + backoff, min(30.0, backoff * 2))
                for addr in profile.addrs:
                    try:
                        await self.net.dial(addr.multiaddr, timeout=3.0)
                        break
                    except Exception as exc:  # noqa: BLE001 - unreachable now; retried with backoff
                        log.debug("mesh dial failed", peer=node_id, addr=addr.multiaddr, error=repr(exc))
    async def _topology_loop(self) -> None:
        events = self.net.peer_events()
        async for peer, connected in events:
            if connected:
                self._disconnected_at.pop(peer, None)
            else:
                self._disconnected_at[peer] = self.clock()
            assert self._nursery is not None
            if connected:
                if peer not in self._edges_announced:
                    self._nursery.start_soon(self._announce_edge, peer)
            else:
                self._nursery.start_soon(self._retract_edge, peer)

    async def _edge_reconcile_loop(self, period: float = 1.0, grace: float = 2.0) -> None:
        """Make State's edges from this node match its connections, whatever happened in
        between: a peer that restarted and reconnected within the retraction grace, while
        the master timed it out (its edges left State with it), or a log replaced by
        another master's. Every ``period`` seconds, for a connected peer in State with no
        edge this node→peer in State and none on its way, the edge is announced; for an edge
        in State to a peer disconnected for ``grace`` seconds, it is retracted."""
        while True:
            await trio.sleep(period)
            state = self.replica.state
            if self.master is None or self.node_id not in state.nodes or self._nursery is None:
                continue
            mine = state.edges.get(self.node_id, {})  # type: ignore[call-overload]
            on_the_way = {
                ev.edge.sink if isinstance(ev, TopologyEdgeCreated) else ev.sink
                for ev in (local.event for local in self._pending.values())
                if isinstance(ev, (TopologyEdgeCreated, TopologyEdgeDeleted))
            }
            connected = set(self.net.connected_peers())
            now = self.clock()
            for peer in connected:
                if peer in state.nodes and peer not in mine and peer not in on_the_way and peer not in self._announcing:
                    self._edges_announced.discard(peer)
                    self._nursery.start_soon(self._announce_edge, peer)
            for peer in mine:
                gone_since = self._disconnected_at.get(peer, self._started_at)
                if peer not in connected and peer not in on_the_way and now - gone_since >= grace:
                    self._edges_announced.discard(peer)
                    self.send_local(TopologyEdgeDeleted(self.node_id, peer))  # type: ignore[arg-type]

    async def _retract_edge(self, peer: str, grace: float = 2.0) -> None:
        """Record that the edge to ``peer`` is gone if it stays disconnected for ``grace``
        seconds (a connection replaced by another, or a brief hiccup, is not a topology
        change worth two events)."""
        await trio.sleep(grace)
        if peer not in self.net.connected_peers() and peer in self._edges_announced:
            self._edges_announced.discard(peer)
            self.send_local(TopologyEdgeDeleted(self.node_id, peer))  # type: ignore[arg-type]

    async def _announce_edge(self, peer: str) -> None:
        """Record the edge this node→``peer`` with the IP at which ``peer`` is reached: from
        the peerstore (identify) or, for an inbound connection, from the peer's profile in
        State; waits up to 10 s for one to be known (an edge without an address is useless
        for ring placement)."""
        if peer in self._announcing:
            return
        self._announcing.add(peer)
        try:
            await self._announce_edge_once(peer)
        finally:
            self._announcing.discard(peer)

    async def _announce_edge_once(self, peer: str) -> None:
        for _ in range(50):
            if peer not in self.net.connected_peers():
                return
            ip = _ip_of(self.net.peer_addrs(peer))
            if not ip:
                profile = self.replica.state.nodes.get(peer)  # type: ignore[call-overload]
                ip = _ip_of([a.multiaddr for a in profile.addrs]) if profile is not None else ""
            if ip:
                if peer not in self._edges_announced:
                    self._edges_announced.add(peer)
                    self.send_local(TopologyEdgeCreated(TopologyEdge(self.node_id, peer, ip)))  # type: ignore[arg-type]
                return
            await trio.sleep(0.2)
        log.warning("no address known for peer; no topology edge", peer=peer)

    # --- commands -----------------------------------------------------------------------------
    async def command(self, command: Command, timeout: float | None = None) -> CommandResult:
        """Send ``command`` to the master (retried across a failover) and return its result;
        a 503 result when no master answers within ``timeout`` seconds."""
        timeout = self.s.command_timeout if timeout is None else timeout
        deadline = trio.current_time() + timeout
        last_error = "no master elected yet"
        while trio.current_time() < deadline:
            master = await self.wait_for_master(deadline - trio.current_time())
            if master is None:
                break
            if master == self.node_id:
                result = await self.hooks.command(command)
            else:
                try:
                    envelope = CommandEnvelope(self.node_id, command)  # type: ignore[arg-type]
                    raw = await self.net.request(master, COMMAND_PROTOCOL, encode(envelope), timeout=max(0.1, deadline - trio.current_time()))
                    result = _command_result_decoder.decode(raw)
                except Exception as exc:  # noqa: BLE001 - any failure: retry with the (new) master
                    last_error = f"master {master} did not answer: {exc}"
                    await trio.sleep(0.2)
                    continue
            if result.error is not None and result.error.code == "not_master":
                await trio.sleep(0.1)
                continue
            if result.error is not None and result.error.code == NOT_MEMBER and trio.current_time() + 0.3 < deadline:
                last_error = result.error.message  # our profile is not indexed yet: retry
                await trio.sleep(0.2)
                continue
            if result.event_idx:
                with trio.move_on_after(max(0.0, min(5.0, deadline - trio.current_time()))):
                    await self.replica.wait_for_idx(result.event_idx)
            return result
        return CommandResult(command.command_id, error=ErrorInfo(503, f"the cluster has no reachable master: {last_error}", "server_error", code="no_master"))

    async def _serve_command(self, peer: str, data: bytes) -> bytes:
        envelope = _command_env_decoder.decode(data)
        if envelope.version != PROTOCOL_VERSION:
            raise ValueError(f"unsupported protocol version {envelope.version}")
        if not self.is_master:
            return encode(CommandResult(envelope.command.command_id, error=ErrorInfo(503, "not the master", "server_error", code="not_master")))
        followers = {p.node_id for p in self.live_peers() if p.master == self.node_id}
        refusal = command_refusal(peer, envelope.origin, self.replica.state.nodes, followers)
        if refusal is not None:
            self._count("command_not_member")
            return encode(CommandResult(envelope.command.command_id, error=ErrorInfo(403, refusal, "permission_error", code=NOT_MEMBER)))
        return encode(await self.hooks.command(envelope.command))

    # --- chunks -------------------------------------------------------------------------------
    def send_chunk(self, destination: str, chunk: Chunk, seq: int) -> None:
        """Send ``chunk``, position ``seq`` of its task's stream (``exo_p2p.chunk_order``),
        to the API node ``destination`` over a direct stream (batched, in order); never blocks."""
        queue = self._chunk_queues.get(destination)
        if queue is None:
            send, receive = trio.open_memory_channel[tuple[Chunk, int]](math.inf)
            self._chunk_queues[destination] = queue = send
            assert self._nursery is not None
            self._nursery.start_soon(self._chunk_sender, destination, receive)
        queue.send_nowait((chunk, seq))

    async def _chunk_sender(self, destination: str, receive) -> None:  # type: ignore[no-untyped-def]
        while True:
            first = await receive.receive()
            batch = [first]
            while len(batch) < 256:
                try:
                    batch.append(receive.receive_nowait())
                except trio.WouldBlock:
                    break
            for attempt in range(3):
                try:
                    message = ChunkBatch(tuple(c for c, _ in batch), tuple(s for _, s in batch))
                    await self.net.request(destination, CHUNKS_PROTOCOL, encode(message), timeout=5.0)
                    break
                except Exception as exc:  # noqa: BLE001
                    log.warning("chunk delivery failed", destination=destination, attempt=attempt, error=repr(exc))
                    await trio.sleep(0.2)
            else:
                self.counters["chunks_lost"] = self.counters.get("chunks_lost", 0) + len(batch)

    async def _serve_chunks(self, peer: str, data: bytes) -> bytes:
        batch = chunk_batch_decoder.decode(data)
        if batch.version != PROTOCOL_VERSION:
            raise ValueError(f"unsupported protocol version {batch.version}")
        if self._on_chunks is not None:
            self._on_chunks(peer, list(batch.chunks), list(batch.seqs))
        return b"ok"


def _ip_of(addrs: list[str]) -> str:
    """The first concrete IPv4 address of ``addrs`` (never ``0.0.0.0``: a topology edge's IP
    is where placement makes a ring rank listen)."""
    for a in addrs:
        parts = a.split("/")
        if len(parts) > 2 and parts[1] == "ip4" and parts[2] != "0.0.0.0":
            return parts[2]
    return ""


def tail_diverged(replica: Replica, request: LogRequest) -> bool:
    """Whether the asker's log, ending at ``request.prev_idx`` with term ``prev_term`` and
    chain digest ``prev_chain``, is not a prefix of ``replica``'s log (pure). True when the
    asker is ahead of us, or our log holds another term or another chain digest at its last
    index (the digest catches logs of two masters that claimed the same term)."""
    if request.prev_idx > replica.last_idx:
        return True
    if request.prev_idx > 0 and replica.term_at(request.prev_idx) != request.prev_term:
        return True
    mine = replica.chain_at(request.prev_idx)
    return bool(request.prev_chain) and mine is not None and mine != request.prev_chain
