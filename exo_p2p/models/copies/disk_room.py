"""Room on the data dir's disk for what a model repository makes a node write
(docs/security.md, docs/models.md#models-from-a-hub).

A node's data dir holds its event log and snapshot as well as its copies of models, so a
repository whose files fill the disk would stop the node (it cannot apply an event it cannot
write: ``exo_p2p.eventlog``). Rules:

- ``check_room``: a node writes ``n`` bytes of a model's files only with
  ``defaults.disk_needed(n)`` (+10%) plus ``DATA_DIR_RESERVE_BYTES`` free, else
  ``DiskFullError``, which the API answers as 507 ``insufficient_storage`` naming the free
  bytes (``hub.manifest.hub_error_status``);
- ``is_disk_full``: a write that failed for want of room (``ENOSPC``, ``EDQUOT``) despite the
  check (something else filled the disk meanwhile): the copy written so far is removed
  (``ModelDepot.discard``) and the caller gets the same 507;
- ``reclaimable``: at start, a node whose data dir has less than the reserve free removes its
  partial copies that no placement uses (``copies.cleanup.reclaim_at_start``), so a disk
  filled by a copy never keeps the node from starting.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable, Set

from exo_p2p import defaults
from exo_p2p.models.errors import FetchError

DATA_DIR_RESERVE_BYTES = 32 * 1024 * 1024
"""Bytes kept free on the data dir's disk for the event log and its snapshot: the log is
compacted at 16 MiB (``defaults.LOG_COMPACT_BYTES``) into a snapshot of State, whose budget
is 32 MiB (``exo_p2p.state.budget``) but is far smaller in practice."""


class DiskFullError(FetchError):
    """Not enough free disk for a model's files (the message names the need and the free bytes)."""

    def __init__(self, message: str, free: int) -> None:
        super().__init__(message)
        self.free = free


def check_room(what: str, need: int, free: int, where: object) -> None:
    """Raise ``DiskFullError`` unless ``free`` bytes (on the disk of ``where``) hold ``need``
    bytes of ``what`` with ``defaults.disk_needed``'s headroom plus ``DATA_DIR_RESERVE_BYTES``."""
    want = defaults.disk_needed(need) + DATA_DIR_RESERVE_BYTES
    if free < want:
        raise DiskFullError(too_little(what, need, free, where), free)


def too_little(what: str, need: int, free: int, where: object) -> str:
    """The one line that says a write of ``need`` bytes of ``what`` does not fit."""
    return (f"not enough free disk for {what}: {_mib(need)} to write, +{defaults.FETCH_DISK_HEADROOM_PERCENT}% and "
            f"{_mib(DATA_DIR_RESERVE_BYTES)} kept for the event log, but {_mib(free)} ({free} bytes) free in {where}")


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a write that failed for want of room (``ENOSPC``, ``EDQUOT``)."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def reclaimable(copies: Iterable[tuple[str, str, bool]], used: Set[str]) -> list[str]:
    """Digests of the partial copies to remove at start: ``copies`` are ``(digest, model name,
    complete)``; an incomplete copy of a model no placement uses (``used``: model names of
    State's instances) is removed, sorted by digest."""
    return sorted(d for d, name, complete in copies if not complete and name not in used)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"

