"""Fetch the chunks a node lacks from the peers that hold them (docs/models.md).

``fetch_chunks`` runs ``streams_per_peer`` workers per holder; every worker takes the next
missing chunk that its peer has not failed, asks for it with ``get_chunk(peer, path, index)``
under ``chunk_timeout`` seconds and hands the bytes to ``PartialModel.write_chunk``, which
verifies them against the manifest before writing. Several holders thus share one shard's
chunks, a fast peer taking more of them.

The hub (holder id ``exo_p2p.models.transfer.fetch_queue.HUB``, when the model comes from one) is the last
source: its workers take only the chunks that every live peer lacks or was dropped for, so a
chunk another node already fetched comes from that node (``HUB_STREAMS`` requests at once).

Failures, and what bounds them:

- a chunk failing verification: the sender is logged (``chunk failed verification``) and
  excluded for that chunk; the chunk goes back to the queue for another holder;
- a holder answering that it does not hold that chunk (a partial copy publishes only that
  it holds *some* chunks; its reply says ``is not held here``): that holder is excluded for
  that chunk, without a strike;
- a request error or a timeout (a stalled peer): the chunk goes back to the queue and the
  peer gets a strike; after ``max_peer_failures`` strikes in a row the peer is dropped for
  the rest of the fetch (a stalled peer costs at most ``max_peer_failures × chunk_timeout``
  seconds per worker, never the whole placement);
- a chunk this node cannot write (a full disk, a models dir without write permission): the
  fetch stops at once with ``FetchError`` naming the directory and the OS error (no holder
  is blamed for it, nothing more is asked for);
- when no usable holder is left for some chunk, ``FetchError`` says which chunks are missing
  and why each holder was dropped. Chunks verified so far stay on disk (the journal), so a
  later fetch — from other holders, or after a restart — asks only for the rest.

Who is asked for which chunk: ``exo_p2p.models.transfer.fetch_queue.ChunkQueue`` (pure); storing the
chunks from worker threads: ``exo_p2p.models.transfer.chunk_writes``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import structlog
import trio

from exo_p2p import defaults
from exo_p2p.models.copies.partial import PartialModel
from exo_p2p.models.errors import FetchError
from exo_p2p.models.manifest import ChunkVerificationError, chunk_span
from exo_p2p.models.transfer.chunk_sets import missing_chunks
from exo_p2p.models.transfer.chunk_writes import Deliver, deliverer, write_all
from exo_p2p.models.transfer.fetch_queue import HUB, ChunkQueue, Key

log = structlog.get_logger(__name__)

GetChunk = Callable[[str, str, int], Awaitable[bytes]]
"""``get_chunk(peer_id, path, index) -> bytes``; may raise anything (counted as a failure)."""
HUB_STREAMS = 4
"""Requests in flight to a hub (holder ``HUB``) at once."""
HUB_TIMEOUT_FACTOR = 4
"""A hub request may take this many chunk timeouts: it retries 429/5xx and resumes dropped
connections itself (``exo_p2p.models.hub.client.HubClient.get_range``)."""
NOT_HELD = "is not held here"
"""What a holder's error reply says for a chunk it lacks (``PartialModel.read_chunk``)."""
GetRun = Callable[[str, list[int], Deliver], Awaitable[None]]
"""``get_run(path, indices, deliver)``: consecutive chunks of one file in one request (the
hub), each handed to ``deliver`` as it completes, from a worker thread (``trio.to_thread``);
raises when the request fails (the chunks delivered before stay stored)."""
Progress = Callable[[int, int, int, int], None]
"""``on_progress(bytes_done, bytes_total, from_peers, from_hub)`` of the chunks this fetch
wanted: ``bytes_done`` counts the chunks held before it began; ``from_peers`` and
``from_hub`` are the bytes it received since, from peers and from the hub (``HUB``)."""


@dataclass(frozen=True)
class FetchLimits:
    """Bounds of one fetch: ``streams_per_peer`` requests in flight per holder,
    ``chunk_timeout`` seconds per chunk request, ``max_peer_failures`` failed requests in a
    row before a holder is dropped (see module docstring). Defaults: ``exo_p2p.defaults``
    ``MODEL_*``."""

    streams_per_peer: int = defaults.MODEL_STREAMS_PER_PEER
    chunk_timeout: float = defaults.MODEL_CHUNK_TIMEOUT
    max_peer_failures: int = defaults.MODEL_MAX_PEER_FAILURES


DEFAULT_LIMITS = FetchLimits()


@dataclass
class FetchReport:
    """What a fetch did: bytes and chunks received and verified, per peer; chunks that failed
    verification, per sender; why holders were dropped."""

    bytes_fetched: int = 0
    chunks_fetched: int = 0
    bytes_by_peer: dict[str, int] = field(default_factory=dict)
    bad_chunks_by_peer: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)


async def fetch_chunks(
    partial: PartialModel,
    wanted: Mapping[str, Sequence[int]],
    holders: Sequence[str],
    get_chunk: GetChunk,
    *,
    limits: FetchLimits = DEFAULT_LIMITS,
    on_progress: Progress | None = None,
    known_held: Mapping[str, Mapping[str, Sequence[int]]] | None = None,
    get_run: GetRun | None = None,
) -> FetchReport:
    """Fetch every chunk of ``wanted`` (path -> indices) that ``partial`` does not hold yet.

    ``on_progress`` counts chunks already held as done (a resumed fetch starts past 0).
    ``known_held`` (peer -> path -> indices, from ``HELD_PROTOCOL``): a peer listed there is
    never asked for a chunk it does not list (as if it had answered ``NOT_HELD``).
    ``get_run(path, indices)`` (the hub's, when given): the bytes of several consecutive
    chunks of one file in one request, one ``bytes`` per chunk.
    On return (or error) every chunk it verified is journaled (``PartialModel.flush``).
    Raises ``FetchError`` (module docstring); chunks verified before it stay held.
    """

    def span(key: Key) -> int:
        start, end = chunk_span(partial.manifest, *key)
        return end - start

    total = sum(span((p, i)) for p, idx in wanted.items() for i in idx)
    todo = [(p, i) for p, idx in missing_chunks(wanted, partial.held()).items() for i in idx]
    done = total - sum(span(key) for key in todo)
    if on_progress:
        on_progress(done, total, 0, 0)
    if not todo:
        return FetchReport()
    queue = ChunkQueue(todo, holders, span, known_held=known_held, runs=get_run is not None)
    fetch = _Fetch(partial, queue, get_chunk, get_run, limits, on_progress, total, done)
    await fetch.run()
    if fetch.write_failed:
        raise FetchError(f"cannot write chunks of {partial.manifest.name} to {partial.root}: "
                         f"{fetch.write_failed[0]}") from fetch.write_failed[0]
    if queue.todo:
        raise _shortfall(partial, queue, fetch.report)
    return fetch.report


def _shortfall(partial: PartialModel, queue: ChunkQueue, report: FetchReport) -> FetchError:
    """The error of a fetch that ended with chunks still wanted: how many, and why each
    holder was dropped, sent bad chunks, or held none of them."""
    why = "; ".join(f"{p}: {r}" for p, r in sorted(report.dropped.items()))
    bad = "; ".join(f"{p} sent {n} bad chunks" for p, n in sorted(report.bad_chunks_by_peer.items()))
    unheld = queue.unheld()
    unheld_note = f"{unheld} chunks held by none of them" if unheld else ""
    reasons = "; ".join(x for x in (why, bad, unheld_note) if x) or "no holders"
    return FetchError(f"{len(queue.todo)} chunks of {partial.manifest.name} could not be fetched "
                      f"(holders {', '.join(queue.holders) or 'none'}: {reasons})")


class _Fetch:
    """One ``fetch_chunks`` call: its workers (``streams_per_peer`` per holder,
    ``HUB_STREAMS`` for the hub), what they ask for (``queue``), what they got (``report``,
    progress) and whether this node's disk failed (``write_failed``: the fetch stops)."""

    def __init__(self, partial: PartialModel, queue: ChunkQueue, get_chunk: GetChunk, get_run: GetRun | None,
                 limits: FetchLimits, on_progress: Progress | None, total: int, done: int) -> None:
        self.partial, self.queue, self.get_chunk, self.get_run = partial, queue, get_chunk, get_run
        self.limits, self.on_progress, self.total, self.done = limits, on_progress, total, done
        self.report = FetchReport()
        self.write_failed: list[OSError] = []
        self._changed = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        self._scope = trio.CancelScope()

    async def run(self) -> None:
        """Run the workers until no chunk is left to ask anyone for, then journal what they
        verified (``PartialModel.flush``, shielded; its ``OSError`` counts as a failed write)."""
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    for peer in self.queue.holders:
                        for _ in range(HUB_STREAMS if peer == HUB else max(1, self.limits.streams_per_peer)):
                            nursery.start_soon(self.worker, peer)
        finally:
            # journal the last chunks now, not at the next checkpoint: what this fetch verified
            # survives a crash right after it, so a restart never asks for it again
            with trio.CancelScope(shield=True):
                try:
                    await trio.to_thread.run_sync(self.partial.flush)
                except OSError as exc:  # the journal could not be written: same as a chunk
                    self.write_failed.append(exc)

    def _wake(self) -> None:
        """Wake the workers waiting for a chunk to become askable."""
        self._changed.set()
        self._changed = trio.Event()

    async def worker(self, peer: str) -> None:
        """Ask ``peer`` for chunk after chunk (``ChunkQueue.next_for``) until it is dropped,
        nothing is left, or nothing it may be asked for can come back."""
        queue = self.queue
        while peer in queue.live and queue.todo:
            key = queue.next_for(peer)
            if key is None:
                if queue.idle_done(peer):
                    return
                await self._changed.wait()
                continue
            keys = queue.run_for(key) if peer == HUB else [key]
            queue.in_flight.update(keys)
            try:
                if not await self._request(peer, keys):
                    return
            except Exception as exc:  # any failure of one request (trio.TooSlowError too)
                if self.write_failed:
                    return  # this node's disk: the fetch stops (settle)
                if NOT_HELD in str(exc) and not isinstance(exc, trio.TooSlowError):
                    queue.exclude(key, peer)  # a partial holder: ask another
                else:
                    self.failed(peer, *key, exc)
            finally:
                queue.in_flight.difference_update(keys)
                self._wake()

    async def _request(self, peer: str, keys: list[Key]) -> bool:
        """One request to ``peer`` for ``keys`` (a run of one file for the hub when it answers
        runs, else one chunk), its chunks stored and settled; False when this node's write
        failed. Raises what the request raised (``trio.TooSlowError`` past its timeout)."""
        path, index = keys[0]
        with trio.fail_after(self.limits.chunk_timeout * (HUB_TIMEOUT_FACTOR if peer == HUB else 1)):
            if peer == HUB and self.get_run is not None:  # each chunk written and settled as it arrives
                await self.get_run(path, [i for _, i in keys], deliverer(self.partial, path, peer, self.settle,
                                                                          self._token))
            else:
                datas = [await self.get_chunk(peer, path, index)]
                # hash + write in a thread: the next chunks keep arriving meanwhile
                results = await trio.to_thread.run_sync(write_all, self.partial, keys, datas)
                for k, data, fresh in zip(keys, datas, results):
                    if not self.settle(peer, k, len(data), fresh):
                        return False
        return True

    def settle(self, peer: str, k: Key, nbytes: int, fresh: object) -> bool:
        """Account one chunk's write result (in trio); False when this node's write failed
        (the fetch stops: ``write_failed``)."""
        if isinstance(fresh, OSError):  # this node's disk, not the peer: stop the fetch
            self.write_failed.append(fresh)
            self._scope.cancel()
            return False
        if isinstance(fresh, ChunkVerificationError):
            self.report.bad_chunks_by_peer[peer] = self.report.bad_chunks_by_peer.get(peer, 0) + 1
            self.queue.exclude(k, peer)
            log.warning("chunk failed verification", peer=peer, path=k[0], index=k[1], error=str(fresh))
        elif self.queue.waiting(k):
            self._accepted(peer, k, nbytes, bool(fresh))
        return True

    def _accepted(self, peer: str, key: Key, nbytes: int, fresh: bool) -> None:
        """``peer`` gave ``key``: no longer wanted; counted and reported when it was new here."""
        self.queue.accepted(peer, key)
        if fresh:
            report = self.report
            report.bytes_fetched += nbytes
            report.chunks_fetched += 1
            report.bytes_by_peer[peer] = report.bytes_by_peer.get(peer, 0) + nbytes
            self.done += nbytes
            if self.on_progress:
                hub = report.bytes_by_peer.get(HUB, 0)
                self.on_progress(self.done, self.total, report.bytes_fetched - hub, hub)

    def failed(self, peer: str, path: str, index: int, exc: Exception) -> None:
        """A request to ``peer`` failed: a strike; dropped after ``max_peer_failures`` in a row."""
        dropped = self.queue.strike(peer, self.limits.max_peer_failures)
        reason = f"no answer within {self.limits.chunk_timeout} s" if isinstance(exc, trio.TooSlowError) else f"{exc}"
        log.info("chunk request failed", peer=peer, path=path, index=index, error=reason)
        if dropped:
            self.report.dropped[peer] = f"{self.queue.strikes[peer]} failed requests in a row, last: {reason}"
