"""Storing a fetch's chunks from worker threads (``exo_p2p.models.transfer.fetch``).

Hashing and writing a chunk (``PartialModel.write_chunk``) blocks, so a fetch does it in a
worker thread while the next chunks arrive. These helpers turn its outcomes into values the
fetch settles in trio: True/False (new, or held already), the ``ChunkVerificationError`` of a
bad chunk (the sender's fault), or the ``OSError`` of a failed write (this node's disk: the
fetch stops).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import trio

from exo_p2p.models.copies.partial import PartialModel
from exo_p2p.models.manifest import ChunkVerificationError

Deliver = Callable[[int, bytes], object]
"""``deliver(index, bytes)`` of a chunk of a run as soon as it arrived (in a worker thread):
stores it (``PartialModel.write_chunk``) and returns True/False (new or held already), the
``ChunkVerificationError`` of a bad chunk, or raises the ``OSError`` of a failed write."""
Settle = Callable[[str, tuple[str, int], int, object], bool]
"""``settle(peer, (path, index), nbytes, result)`` in trio: accounts one chunk's write result;
False when the fetch stops (this node's write failed)."""


def write_one(partial: PartialModel, path: str, index: int, data: bytes) -> object:
    """``partial.write_chunk``: True/False (new or not), or the ``ChunkVerificationError`` of a
    bad chunk; raises ``OSError`` (blocking)."""
    try:
        return partial.write_chunk(path, index, data)
    except ChunkVerificationError as exc:
        return exc


def write_all(partial: PartialModel, keys: list[tuple[str, int]], datas: list[bytes]) -> list:
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


def deliverer(partial: PartialModel, path: str, peer: str, settle: Settle, token: trio.lowlevel.TrioToken) -> Deliver:
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
            result = write_one(partial, path, index, data)
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
