"""The role keeper: runs the election (``election.election_step``) and becomes or leaves
master accordingly.

Rules: only claims ``cluster.claims`` admits take part (a claimer refused, or whose log is
being probed, is left out; a pending one still holds off an election). A node becoming
master first fetches what the live peers it considered applied and it lacks (``catch_up``);
it takes term ``max(term, State's term + 1)``. A follower takes its master's term, even a
lower one: the winner of a healed partition may have the lower term (``election.master_rank``)
and its events must not look stale here. A master stepping down syncs its log first.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
import trio

from exo_p2p import defaults
from exo_p2p.cluster.claims import ClaimChecker, ClaimStatus, ProbeAnswer, probe_answer
from exo_p2p.cluster.common import Counters, Pulse, Role
from exo_p2p.cluster.election import ElectionStep, Seat, election_step, settle_for, support
from exo_p2p.cluster.heartbeats import PeerView
from exo_p2p.cluster.messages import LOG_PROTOCOL, Heartbeat, LogRequest, encode, log_response_decoder
from exo_p2p.cluster.settings import ClusterSettings, MasterHooks
from exo_p2p.replica import Replica

log = structlog.get_logger(__name__)


def start_settle(node_id: str, nodes_in_state: list[str], settle: float, known_settle: float) -> float:
    """Seconds to wait for a master after start: ``settle``, or ``known_settle`` when State
    lists other nodes (this node was in a cluster: its dials to their known addresses get time
    before it may claim, else a restarted node that reaches nobody within ``settle`` claims
    the term the others may have just used)."""
    others = any(n != node_id for n in nodes_in_state)
    return max(settle, known_settle) if others else settle


class RoleKeeper:
    """Writes ``role`` (master, term, is_master). ``on_change`` callbacks run after every
    change of master; ``catch_up(peer) -> bool`` fetches the log from ``peer``."""

    def __init__(self, net, replica: Replica, role: Role, peers: PeerView, hooks: MasterHooks,  # type: ignore[no-untyped-def]
                 settings: ClusterSettings, counters: Counters, clock: Callable[[], float]) -> None:
        self.net, self.replica, self.role, self.peers, self.hooks = net, replica, role, peers, hooks
        self.settings, self.counters, self.clock = settings, counters, clock
        self.claims = ClaimChecker()
        self.started_at = clock()
        self.masterless_since: float | None = clock()
        self.master_since = clock()
        """When this node last became master (the timeout grace of ``peer_timeouts``)."""
        self.lost_master: str | None = None
        """The master this node followed and lost most recently, while it has not followed
        another one since (``peer_timeouts``: no grace for it when this node takes over)."""
        self.rival_since: float | None = None
        """Since when this master has heard an admitted rival claim (``election`` rule 4)."""
        self.followed = False
        """Whether this node has followed (or been) a master since it started."""
        self.lock = trio.Lock()
        self.changed = Pulse()
        self.on_change: list[Callable[[str | None], None]] = []
        self.catch_up: Callable[[str], Awaitable[bool]] = _never
        self._considered: list[Heartbeat] = []
        """The peers the last election pass considered (a claim catches up from them)."""

    async def run(self) -> None:
        async with trio.open_nursery() as probes:
            while True:
                await self.enact(self.step(self.clock(), probes))
                await trio.sleep(defaults.ELECTION_TICK)

    def step(self, now: float, probes: trio.Nursery | None) -> ElectionStep:
        """One pass of the election over what this node hears at ``now``."""
        peers, pending = self.admitted(self.peers.reachable_peers(now), now, probes)
        self._considered = peers
        settle = settle_for(now, self.started_at, self.start_settle(), self.settings.failover_settle, followed=self.followed)
        seat = Seat(self.role.master, self.role.term, self.masterless_since, self.rival_since)
        return election_step(seat, self.peers.own_heartbeat(), peers, pending, now, settle=settle)

    async def enact(self, step: ElectionStep) -> None:
        self.masterless_since, self.rival_since = step.seat.masterless_since, step.seat.rival_since
        if step.yielded:
            log.warning("yielding to a rival master that refuses this one's claim", rival=step.follow, term=step.term)
            self.counters.add("master_yielded")
        if step.lost:
            log.warning("master gone", master=self.role.master)
            await self.set_master(None, self.role.term)
        if step.claim is not None:
            await self.claim(step.claim, self._considered)
        elif step.follow is not None:
            await self.set_master(step.follow, step.term)

    def start_settle(self) -> float:
        return start_settle(self.role.node_id, list(self.replica.state.nodes), self.settings.settle, self.settings.known_settle)

    def admitted(self, peers: list[Heartbeat], now: float, probes: trio.Nursery | None) -> tuple[list[Heartbeat], list[Heartbeat]]:
        """``peers`` without the master claims ``cluster.claims`` does not admit (yet), and
        the pending claims (a probe of the claimer's log in flight or starting now)."""
        everyone = [self.peers.own_heartbeat(), *peers]
        out: list[Heartbeat] = []
        pending: list[Heartbeat] = []
        for p in peers:
            status = ClaimStatus.ADMITTED if p.master != p.node_id else self.claims.status(
                p, side=support(everyone, p.node_id), following=(self.role.master, self.role.term),
                own_last_idx=self.replica.last_idx, own_term=max(self.role.term, self.replica.last_term),
                chain_at=self.replica.chain_at, now=now,
            )
            if status is ClaimStatus.ADMITTED:
                out.append(p)
            elif status is ClaimStatus.REFUSED:
                self.counters.drop("master_claim_refused")
            else:
                pending.append(p)
                if status is ClaimStatus.PROBE and probes is not None:
                    self.claims.probe_started(p)
                    probes.start_soon(self._probe_claim, p)
        return out, pending

    async def _probe_claim(self, claim: Heartbeat) -> None:
        """Ask a claimer for the events after our last index (``cluster.claims`` rule 3)."""
        last = self.replica.last_idx
        request = LogRequest(from_idx=last + 1, max_events=1, prev_idx=last, prev_term=self.replica.last_term,
                             prev_chain=self.replica.chain_at(last) or b"")
        response = None
        try:
            with trio.fail_after(defaults.CLAIM_PROBE_TIMEOUT):
                raw = await self.net.request(claim.node_id, LOG_PROTOCOL, encode(request), timeout=defaults.CLAIM_PROBE_TIMEOUT)
            response = log_response_decoder.decode(raw)
        except Exception as exc:  # noqa: BLE001 - no answer: refused (re-checked later)
            log.debug("claim probe failed", claimer=claim.node_id, error=repr(exc))
        finally:
            answer = probe_answer(response)
            self.claims.probe_done(claim, answer, self.clock())
        if answer is not ProbeAnswer.EXTENDS:
            log.info("master claim probed", claimer=claim.node_id, term=claim.term, answer=answer.value)

    async def claim(self, term: int, peers: list[Heartbeat] | None = None) -> None:
        """Become master: fetch what live peers (``peers``: those the election considered,
        not a refused claimer) applied that we lack, then sequence."""
        candidates = self.peers.live_peers() if peers is None else peers
        best = max(candidates, key=lambda p: p.last_idx, default=None)
        if best is not None and best.last_idx > self.replica.last_idx:
            await self.catch_up(best.node_id)
            if self.replica.last_idx < best.last_idx:
                return  # could not catch up yet; try again next round
        async with self.lock:
            self.role.term = max(term, self.replica.state.term + 1)
            self.role.master = self.role.node_id
            self.role.is_master = True
            self.followed = True
            self.master_since = self.clock()
            self.replica.defer_sync = True  # group commit: synced before anything leaves
            self.masterless_since = None
            log.info("became master", term=self.role.term, last_idx=self.replica.last_idx)
            await self.hooks.start(self.role.term)
        self._changed(self.role.master)

    async def set_master(self, master: str | None, term: int) -> None:
        """Follow ``master`` (None: none) at ``term``; steps down first when this node is master."""
        async with self.lock:
            if self.role.is_master and master != self.role.node_id:
                log.warning("stepping down", new_master=master, term=term)
                self.role.is_master = False
                await self.hooks.stop()
                self.replica.defer_sync = False
                self.replica.sync()
            if master != self.role.master:
                log.info("following master", master=master, term=term)
            if master is None and self.role.master not in (None, self.role.node_id):
                self.lost_master = self.role.master
            elif master is not None:
                self.lost_master = None
            self.role.master = master
            self.followed = self.followed or master is not None
            self.role.term = term if master is not None else self.role.term
            self.masterless_since = None if master is not None else self.clock()
        self._changed(master)

    def _changed(self, master: str | None) -> None:
        self.changed.fire()
        for callback in self.on_change:
            callback(master)

    async def wait_for_master(self, timeout: float) -> str | None:
        """The master, waiting up to ``timeout`` seconds for one (None: none by then)."""
        with trio.move_on_after(timeout):
            while self.role.master is None:
                await self.changed.wait()
        return self.role.master


async def _never(_peer: str) -> bool:
    return False
