"""Log following: apply the master's indexed events in order, fetch what gossip missed, and
serve this node's log to others.

Rules:
- ``global_batch_verdict``: indexed events are taken only from the node this node follows
  as master (never while master itself), of this protocol version; events of an older term
  than this node's are dropped (counted ``global_event_stale_term``).
- ``takes_gossip``: a follower takes gossiped events only once a fetch from its master, since
  the last change of master, found its tail a prefix of the master's log; until then they are
  dropped (counted ``global_event_unchecked``) and the fetch brings them. Every change of
  master, this node's own mastership included, starts a new check: a master that stepped
  down holds events of its own at indices the winner filled with others, and the winner's next
  gossiped event (index last + 1) would otherwise extend that tail
  (docs/architecture.md#log-guarantees).
- A follower fetches from its master over a direct stream when the master's heartbeat shows
  events it lacks, when its replica has a gap, and once after following a new master (to
  check its tail agrees); when the master is unreachable, from up to
  ``LOG_FETCH_FALLBACK_PEERS`` peers following the same master in the same term whose log
  holds no later term (a former master that stepped down keeps its divergent tail until it
  has synced) and whose log is ahead of this node's (a peer behind holds nothing this node
  lacks), most advanced first (``fetch_sources``). A fetch resumes from the last
  applied index. A snapshot from a fallback peer that ends before this node's last applied
  index is never installed (``takes_snapshot``): a peer behind answers "diverged" to any
  asker ahead of it, and installing its State would rewind this node's, dropping events the
  master may have counted as committed on this node's word. Only a fetch from the master
  itself tells that this node's tail agrees with the master's log: a fallback peer's answer does not end the check (two followers
  that both missed the check once held another master's tail and vouched for each other).
- ``tail_diverged`` / ``log_answer``: the server answers with its State as a snapshot when
  the asker's tail is not a prefix of its log or the range was compacted, else the events:
  at most ``LOG_SERVE_MAX_EVENTS`` and ``LOG_SERVE_MAX_BYTES`` (4 MiB of log frames, at least
  one event) a response, so a follower far behind catches up in several requests and no
  response approaches the request frame limit (64 MiB) whatever the events' size. Heartbeats
  travel on streams of their own (``direct_heartbeat``, gossip) over the same connection,
  whose muxer interleaves streams in frames of 64 KiB (docs/architecture.md#networking-notes,
  note 12): what a log transfer can hold them up by is the work of one bounded response.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import structlog
import trio

from exo_p2p import defaults
from exo_p2p.cluster.common import Counters, Role, Wake
from exo_p2p.cluster.event_times import EventTimes
from exo_p2p.cluster.heartbeats import PeerView
from exo_p2p.cluster.messages import (
    LOG_PROTOCOL, Heartbeat, IndexedEventBatch, LogRequest, LogResponse, decode_global, encode, log_request_decoder,
    log_response_decoder,
)
from exo_p2p.cluster.settings import ClusterSettings
from exo_p2p.replica import Replica
from exo_p2p.types import PROTOCOL_VERSION

log = structlog.get_logger(__name__)


def global_batch_verdict(batch: IndexedEventBatch, sender: str, role: Role) -> str | None:
    """None to take ``batch`` from ``sender``; else the drop kind (module docstring)."""
    if batch.version != PROTOCOL_VERSION or any(e.version != PROTOCOL_VERSION for e in batch.events):
        return "global_event_version"
    if sender != role.master or role.is_master:
        return "global_event_not_from_master"
    return None


def takes_gossip(checked_epoch: int | None, epoch: int) -> bool:
    """Whether gossiped events may be applied now (pure): only when the tail was checked
    against the master in this ``epoch`` (the count of master changes; module docstring)."""
    return checked_epoch == epoch


def fetch_sources(master: str, term: int, peers: Sequence[Heartbeat], n: int, after: int = 0) -> list[str]:
    """Peers to fetch from when ``master`` is unreachable: following it at ``term``, their log
    holding no later term than ``term`` and events after index ``after`` (this node's last
    applied), most advanced first, ``n`` at most."""
    same = sorted((p for p in peers if p.master == master and p.term == term and p.last_term <= term
                   and p.node_id != master and p.last_idx > after),
                  key=lambda p: -p.last_idx)
    return [p.node_id for p in same[:n]]


def takes_snapshot(peer: str, master: str | None, snapshot_idx: int, last_idx: int) -> bool:
    """Whether a snapshot ending at index ``snapshot_idx`` sent by ``peer`` replaces a State
    applied up to ``last_idx`` (pure). The master's snapshot always does (its log is the
    cluster's: a tail it does not hold is dropped, docs/architecture.md#log-guarantees); a
    fallback peer's only when it is not behind this node."""
    return peer == master or snapshot_idx >= last_idx


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


def log_answer(replica: Replica, request: LogRequest) -> LogResponse:
    """The answer to ``request`` (module docstring): events at most ``LOG_SERVE_MAX_EVENTS``,
    their log frames at most ``LOG_SERVE_MAX_BYTES`` bytes (one event at least)."""
    chain = replica.chain_at(replica.last_idx) or b""
    if tail_diverged(replica, request):
        return LogResponse(snapshot=replica.state, last_idx=replica.last_idx, snapshot_chain=chain, diverged=True)
    events = replica.events_from(request.from_idx, min(request.max_events, defaults.LOG_SERVE_MAX_EVENTS),
                                 defaults.LOG_SERVE_MAX_BYTES)
    if events is None:
        return LogResponse(snapshot=replica.state, last_idx=replica.last_idx, snapshot_chain=chain)
    return LogResponse(events=tuple(events), last_idx=replica.last_idx)


class LogFollower:
    """``run(channel)``: take gossiped indexed events and keep up by fetching; ``fetch_from``;
    ``serve`` (the ``LOG_PROTOCOL`` handler); ``wake()`` to check for a fetch now."""

    def __init__(self, net, replica: Replica, role: Role, peers: PeerView, settings: ClusterSettings,  # type: ignore[no-untyped-def]
                 counters: Counters, event_times: EventTimes) -> None:
        self.net, self.replica, self.role, self.peers = net, replica, role, peers
        self.settings, self.counters, self.event_times = settings, counters, event_times
        self.wake_up = Wake()
        self.epoch = 0
        """How many times this node's master changed (its own mastership included)."""
        self.checked: int | None = None
        """The ``epoch`` in which a fetch from the master found this node's tail a prefix of
        the master's log (None: not yet)."""

    def wake(self, *_args: object) -> None:
        self.wake_up.set()

    async def run(self, channel) -> None:  # type: ignore[no-untyped-def]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._receive_loop, channel)
            nursery.start_soon(self._sync_loop)

    def master_changed(self, _master: str | None) -> None:
        """Called after every change of master (this node's own mastership included): the
        tail must be checked again before gossip is taken (``takes_gossip``)."""
        self.epoch += 1
        self.wake()

    def tail_checked(self) -> bool:
        """Whether this node's log is known to be a prefix of its master's log."""
        return takes_gossip(self.checked, self.epoch)

    async def _receive_loop(self, channel) -> None:  # type: ignore[no-untyped-def]
        async for sender, data in channel:
            self.take_gossip(sender, data)

    def take_gossip(self, sender: str, data: bytes) -> None:
        """Apply one global-events gossip message from ``sender`` (module docstring)."""
        try:
            batch = decode_global(data)
        except msgspec.DecodeError:
            self.counters.drop("global_event_undecodable")
            return
        if (verdict := global_batch_verdict(batch, sender, self.role)) is not None:
            self.counters.drop(verdict)
            return
        if not self.tail_checked():
            self.counters.drop("global_event_unchecked")
            self.wake()
            return
        fresh = [e for e in batch.events if e.term >= self.role.term]
        if len(fresh) < len(batch.events):
            self.counters.drop("global_event_stale_term")
        for e in fresh:
            if e.idx > self.replica.last_idx:
                self.event_times.received(e.idx)
        outcomes = self.replica.offer_many(fresh)
        if "buffered" in outcomes:
            self.wake()
        if "duplicate" in outcomes:
            self.counters.drop("global_event_duplicate")

    def _behind(self, master: str) -> bool:
        hb = self.peers.liveness.get(master)
        ahead = hb is not None and hb.last_idx > self.replica.last_idx
        return ahead or self.replica.missing_range() is not None or not self.tail_checked()

    async def _sync_loop(self) -> None:
        while True:
            await self.wake_up.wait(defaults.LOG_SYNC_POLL)
            master = self.role.master
            if master is None or self.role.is_master or not self._behind(master):
                continue
            if await self.fetch_from(master):
                continue
            sources = fetch_sources(master, self.role.term, self.peers.live_peers(), defaults.LOG_FETCH_FALLBACK_PEERS,
                                    after=self.replica.last_idx)
            for peer in sources:
                if await self.fetch_from(peer):
                    break

    async def _request(self, peer: str) -> LogResponse | None:
        last = self.replica.last_idx
        request = LogRequest(from_idx=last + 1, prev_idx=last, prev_term=self.replica.last_term, prev_chain=self.replica.chain_at(last) or b"")
        timeout = self.settings.request_timeout
        try:
            with trio.fail_after(timeout):
                raw = await self.net.request(peer, LOG_PROTOCOL, encode(request), timeout=timeout)
            return log_response_decoder.decode(raw)
        except Exception as exc:  # noqa: BLE001 - unreachable, too slow, undecodable
            log.warning("log fetch failed", peer=peer, error=repr(exc))
            self.counters.drop("log_fetch_failed")
            return None

    async def fetch_from(self, peer: str) -> bool:
        """Fetch events after our last index from ``peer`` (the master, or a peer following
        it) until caught up, installing its snapshot when our tail diverged from its log.
        Returns False when the exchange failed (peer unreachable, bad answer)."""
        master, epoch = self.role.master, self.epoch
        for _ in range(defaults.LOG_FETCH_MAX_ROUNDS):
            response = await self._request(peer)
            if response is None:
                return False
            if response.snapshot is not None:
                if not takes_snapshot(peer, master, response.snapshot.last_event_idx, self.replica.last_idx):
                    log.warning("refusing an older snapshot from a fallback peer", peer=peer,
                                idx=response.snapshot.last_event_idx, last_idx=self.replica.last_idx)
                    self.counters.drop("log_snapshot_behind")
                    return False
                log.info("installing snapshot", peer=peer, idx=response.snapshot.last_event_idx)
                self.replica.install_snapshot(response.snapshot, response.snapshot_chain or None)
            before = self.replica.last_idx
            self.replica.offer_many(list(response.events))
            if self.replica.last_idx > before:  # gaps recovered by fetch, not gossip
                self.counters.add("log_fetch_applied", self.replica.last_idx - before)
            if peer == master and epoch == self.epoch:  # not a master this node has left meanwhile
                self.checked = epoch
            if (not response.events and response.snapshot is None) or self.replica.last_idx >= response.last_idx:
                return True
        return True

    async def serve(self, _peer: str, data: bytes) -> bytes:
        """The ``LOG_PROTOCOL`` handler: what we serve is persisted here first (the master
        defers its fsyncs)."""
        request = log_request_decoder.decode(data)
        self.replica.sync()
        return encode(log_answer(self.replica, request))

