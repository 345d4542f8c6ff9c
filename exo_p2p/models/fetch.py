"""Fetch the chunks a node lacks from the peers that hold them (docs/models.md).

``fetch_chunks`` runs ``streams_per_peer`` workers per holder; every worker takes the next
missing chunk that its peer has not failed, asks for it with ``get_chunk(peer, path, index)``
under ``chunk_timeout`` seconds and hands the bytes to ``PartialModel.write_chunk``, which
verifies them against the manifest before writing. Several holders thus share one shard's
chunks, a fast peer taking more of them.

The hub (holder id ``exo_p2p.models.hub.HUB``, when the model comes from one) is the last
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
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import structlog
import trio

from exo_p2p import defaults
from exo_p2p.models.hub import HUB
from exo_p2p.models.manifest import chunk_span, missing_chunks
from exo_p2p.models.partial import ChunkVerificationError, PartialModel

log = structlog.get_logger(__name__)

GetChunk = Callable[[str, str, int], Awaitable[bytes]]
"""``get_chunk(peer_id, path, index) -> bytes``; may raise anything (counted as a failure)."""
HUB_STREAMS = 4
"""Requests in flight to a hub (holder ``HUB``) at once."""
HUB_RUN_BYTES = 16 * 1024 * 1024
HUB_RUN_CHUNKS = 1024
"""At most this many bytes and chunks of consecutive chunks in one hub request (``get_run``;
each chunk is written as it arrives and journaled at the copy's next checkpoint, so a
restart refetches at most what arrived since: ``exo_p2p.models.partial``). Fewer, longer
requests: each costs a redirect and a round trip to the hub's CDN. The byte bound is the
one that normally ends a run: chunks are cut at every tensor's bounds, so most are far
smaller than the copy's chunk size (the embedded model's average ~110 KB, not 256 KiB)."""
HUB_TIMEOUT_FACTOR = 4
"""A hub request may take this many chunk timeouts: it retries 429/5xx and resumes dropped
connections itself (``exo_p2p.models.hub.HubClient.get_range``)."""
NOT_HELD = "is not held here"
"""What a holder's error reply says for a chunk it lacks (``PartialModel.read_chunk``)."""
Deliver = Callable[[int, bytes], object]
"""``deliver(index, bytes)`` of a chunk of a run as soon as it arrived (in a worker thread):
stores it (``PartialModel.write_chunk``) and returns True/False (new or held already), the
``ChunkVerificationError`` of a bad chunk, or raises the ``OSError`` of a failed write."""
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


class FetchError(RuntimeError):
    """The fetch cannot finish: no usable holder is left for some chunk (message says why)."""


@dataclass
class FetchReport:
    """What a fetch did: bytes and chunks received and verified, per peer; chunks that failed
    verification, per sender; why holders were dropped."""

    bytes_fetched: int = 0
    chunks_fetched: int = 0
    bytes_by_peer: dict[str, int] = field(default_factory=dict)
    bad_chunks_by_peer: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)


def _write_one(partial: PartialModel, path: str, index: int, data: bytes) -> object:
    """``partial.write_chunk``: True/False (new or not), or the ``ChunkVerificationError`` of a
    bad chunk; raises ``OSError`` (blocking)."""
    try:
        return partial.write_chunk(path, index, data)
    except ChunkVerificationError as exc:
        return exc


def _write_all(partial: PartialModel, keys: list[tuple[str, int]], datas: list[bytes]) -> list:
    """``partial.write_chunk`` of each chunk in order: True/False (new or not), or the
    ``ChunkVerificationError`` of a bad one; the first ``OSError`` ends the list (blocking)."""
    out: list = []
    for (path, index), data in zip(keys, datas):
        try:
            out.append(partial.write_chunk(path, index, data))
        except ChunkVerificationError as exc:
            out.append(exc)
        except OSError as exc:
            out.append(exc)
            break
    return out


def _deliverer(partial: PartialModel, path: str, peer: str,
               settle: Callable[[str, tuple[str, int], int, object], bool], token: trio.lowlevel.TrioToken) -> Deliver:
    """``deliver`` for a run of ``path`` (called in the run's thread): writes each chunk, then
    queues its ``settle`` for trio (progress while the run goes on) without waiting for
    trio's loop: the chunks written while trio is busy are settled together, in order, by
    one call (``token.run_sync_soon``; trio runs those calls in order, so all of them before
    the run's own completion). Raises the ``OSError`` of a failed write (the run stops), and
    ``trio.Cancelled`` once the fetch gave up on the run (an abandoned thread stops
    downloading: ``trio.from_thread.check_cancelled``)."""
    queued: list[tuple[str, tuple[str, int], int, object]] = []
    lock = threading.Lock()

    def drain() -> None:  # in trio
        with lock:
            items = queued[:]
            queued.clear()
        for item in items:
            settle(*item)

    def deliver(index: int, data: bytes) -> object:
        trio.from_thread.check_cancelled()
        try:
            result = _write_one(partial, path, index, data)
        except OSError as exc:
            result = exc
        with lock:
            queued.append((peer, (path, index), len(data), result))
            first = len(queued) == 1  # else a drain is queued already and will take it
        if first:
            token.run_sync_soon(drain)
        if isinstance(result, OSError):
            raise result
        return result

    return deliver


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
    report = FetchReport()
    total = sum(e - s for p, idx in wanted.items() for s, e in
                (chunk_span(partial.manifest, p, i) for i in idx))
    todo = [(p, i) for p, idx in missing_chunks(wanted, partial.held()).items() for i in idx]
    done = total - sum(e - s for s, e in (chunk_span(partial.manifest, p, i) for p, i in todo))
    if on_progress:
        on_progress(done, total, 0, 0)
    if not todo:
        return report
    excluded: dict[tuple[str, int], set[str]] = {}
    waiting = set(todo)  # todo as a set: run_for asks often
    for peer, held in (known_held or {}).items():
        sets = {p: set(idx) for p, idx in held.items()}
        for key in todo:
            if key[1] not in sets.get(key[0], ()):
                excluded.setdefault(key, set()).add(peer)
    strikes = {peer: 0 for peer in holders}
    live = set(holders)
    in_flight: set[tuple[str, int]] = set()
    state = {"done": done, "changed": trio.Event()}
    token = trio.lowlevel.current_trio_token()
    write_failed: list[OSError] = []

    def changed() -> None:
        state["changed"].set()
        state["changed"] = trio.Event()

    def peer_could(key: tuple[str, int]) -> bool:
        """Some live holder other than the hub may still have ``key`` (the hub comes last)."""
        return any(p != HUB and p in live and p not in excluded.get(key, ()) for p in holders)

    def next_for(peer: str) -> tuple[str, int] | None:
        for key in todo:
            if key not in in_flight and peer not in excluded.get(key, ()) and (peer != HUB or not peer_could(key)):
                return key
        return None

    def run_for(key: tuple[str, int]) -> list[tuple[str, int]]:
        """``key`` and the chunks right after it in its file that only the hub can give, up
        to ``HUB_RUN_BYTES``: one range request for them all."""
        path, index = key
        run, size = [key], span(key)
        while get_run is not None:
            nxt = (path, run[-1][1] + 1)
            if (nxt not in waiting or nxt in in_flight or HUB in excluded.get(nxt, ()) or peer_could(nxt)
                    or size + span(nxt) > HUB_RUN_BYTES or len(run) >= HUB_RUN_CHUNKS):
                break
            run.append(nxt)
            size += span(nxt)
        return run

    def span(key: tuple[str, int]) -> int:
        start, end = chunk_span(partial.manifest, *key)
        return end - start

    def accepted(peer: str, key: tuple[str, int], nbytes: int, fresh: bool) -> None:
        strikes[peer] = 0
        todo.remove(key)
        waiting.discard(key)
        if fresh:
            report.bytes_fetched += nbytes
            report.chunks_fetched += 1
            report.bytes_by_peer[peer] = report.bytes_by_peer.get(peer, 0) + nbytes
            state["done"] += nbytes
            if on_progress:
                hub = report.bytes_by_peer.get(HUB, 0)
                on_progress(state["done"], total, report.bytes_fetched - hub, hub)

    async def worker(peer: str) -> None:
        while peer in live and todo:
            key = next_for(peer)
            if key is None:
                if not in_flight and (peer != HUB or not any(peer_could(k) for k in todo)):
                    return
                await state["changed"].wait()
                continue
            keys = run_for(key) if peer == HUB else [key]
            in_flight.update(keys)
            path, index = key
            try:
                with trio.fail_after(limits.chunk_timeout * (HUB_TIMEOUT_FACTOR if peer == HUB else 1)):
                    if peer == HUB and get_run is not None:  # each chunk written and settled as it arrives
                        await get_run(path, [i for _, i in keys], _deliverer(partial, path, peer, settle, token))
                    else:
                        datas = [await get_chunk(peer, path, index)]
                        # hash + write in a thread: the next chunks keep arriving meanwhile
                        results = await trio.to_thread.run_sync(_write_all, partial, keys, datas)
                        for k, data, fresh in zip(keys, datas, results):
                            if not settle(peer, k, len(data), fresh):
                                return
            except Exception as exc:  # any failure of one request (trio.TooSlowError too)
                if write_failed:
                    return  # this node's disk: the fetch stops (settle)
                if NOT_HELD in str(exc) and not isinstance(exc, trio.TooSlowError):
                    excluded.setdefault(key, set()).add(peer)  # a partial holder: ask another
                else:
                    failed(peer, path, index, exc)
            finally:
                in_flight.difference_update(keys)
                changed()

    def settle(peer: str, k: tuple[str, int], nbytes: int, fresh: object) -> bool:
        """Account one chunk's write result (in trio); False when this node's write failed
        (the fetch stops: ``write_failed``)."""
        if isinstance(fresh, OSError):  # this node's disk, not the peer: stop the fetch
            write_failed.append(fresh)
            scope.cancel()
            return False
        if isinstance(fresh, ChunkVerificationError):
            report.bad_chunks_by_peer[peer] = report.bad_chunks_by_peer.get(peer, 0) + 1
            excluded.setdefault(k, set()).add(peer)
            log.warning("chunk failed verification", peer=peer, path=k[0], index=k[1], error=str(fresh))
        elif k in waiting:
            accepted(peer, k, nbytes, bool(fresh))
        return True

    def failed(peer: str, path: str, index: int, exc: Exception) -> None:
        """A request to ``peer`` failed: a strike; dropped after ``max_peer_failures`` in a row."""
        strikes[peer] += 1
        reason = f"no answer within {limits.chunk_timeout} s" if isinstance(exc, trio.TooSlowError) else f"{exc}"
        log.info("chunk request failed", peer=peer, path=path, index=index, error=reason)
        if strikes[peer] >= limits.max_peer_failures and peer in live:
            live.discard(peer)
            report.dropped[peer] = f"{strikes[peer]} failed requests in a row, last: {reason}"

    try:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                for peer in holders:
                    for _ in range(HUB_STREAMS if peer == HUB else max(1, limits.streams_per_peer)):
                        nursery.start_soon(worker, peer)
    finally:
        # journal the last chunks now, not at the next checkpoint: what this fetch verified
        # survives a crash right after it, so a restart never asks for it again
        with trio.CancelScope(shield=True):
            try:
                await trio.to_thread.run_sync(partial.flush)
            except OSError as exc:  # the journal could not be written: same as a chunk
                write_failed.append(exc)
    if write_failed:
        raise FetchError(f"cannot write chunks of {partial.manifest.name} to {partial.root}: "
                         f"{write_failed[0]}") from write_failed[0]
    if todo:
        why = "; ".join(f"{p}: {r}" for p, r in sorted(report.dropped.items()))
        bad = "; ".join(f"{p} sent {n} bad chunks" for p, n in sorted(report.bad_chunks_by_peer.items()))
        unheld = sum(1 for k in todo if set(holders) <= excluded.get(k, set()))
        unheld_note = f"{unheld} chunks held by none of them" if unheld else ""
        reasons = "; ".join(x for x in (why, bad, unheld_note) if x) or "no holders"
        raise FetchError(f"{len(todo)} chunks of {partial.manifest.name} could not be fetched "
                         f"(holders {', '.join(holders) or 'none'}: {reasons})")
    return report
