"""A bounded, read-only probe of when indexed events were published and applied.

Each node keeps, per global event index ``idx``:

- ``published[idx]``: on the master, the moment it handed the indexed event to gossip (just
  before ``Network.publish`` on the global-events topic; the master has already applied and
  persisted it by then);
- ``applied[idx]``: on every node (the master too), the moment ``Replica`` finished applying
  it (State updated and the event appended to the on-disk log, fsynced when the replica
  syncs), whether it arrived by gossip or by a log fetch. Indices installed wholesale from a
  snapshot have no apply time;
- ``received[idx]``: on a follower, the first moment the indexed event came out of gossip
  into the cluster member (decoded, not yet applied): ``received - published`` is the
  network and libp2p part of the latency, ``applied - received`` the node's own part (its
  wait for a gap to fill included). Events that came by a log fetch, or by gossip only after
  they were applied, have no receive time.

Times are seconds of ``CLOCK_MONOTONIC`` (``time.monotonic()``): comparable between processes
on one host only (the cluster benchmark runs every node on one host), meaningless across
machines. Each table keeps the last ``capacity`` indices recorded (oldest dropped first), so
memory stays bounded however long the node runs. A re-recorded index (a new master
re-publishing, a truncated tail applied again) keeps its latest time.

``GET /debug/event-times?since=IDX`` serves ``EventTimes.since(IDX)`` (see ``EventTimesView``):
the node's API reaches it through ``ApiBackend.event_times``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec

DEFAULT_CAPACITY = 4096
"""Indices kept per table (published, applied)."""


class EventTimesView(msgspec.Struct, frozen=True):
    """What ``GET /debug/event-times`` answers for one node.

    ``published`` / ``received`` / ``applied`` map event index → seconds of ``CLOCK_MONOTONIC`` (JSON object
    keys are the decimal indices); only indices ≥ ``since`` are included. ``capacity`` is how
    many indices each table keeps; ``oldest_*`` is the smallest index still held (None when
    empty), so a reader can tell "never recorded" from "already dropped"."""

    node_id: str
    clock: str
    unit: str
    since: int
    capacity: int
    oldest_published: int | None
    oldest_applied: int | None
    published: dict[int, float]
    received: dict[int, float]
    applied: dict[int, float]


class _Ring:
    """``idx → time`` keeping the last ``capacity`` insertions (a dict in insertion order)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.times: dict[int, float] = {}

    def record(self, idx: int, t: float, *, keep_first: bool = False) -> None:
        if idx in self.times:
            if keep_first:
                return
            del self.times[idx]
        self.times[idx] = t
        while len(self.times) > self.capacity:
            del self.times[next(iter(self.times))]

    def since(self, idx: int) -> dict[int, float]:
        return {i: t for i, t in self.times.items() if i >= idx}

    def oldest(self) -> int | None:
        return min(self.times) if self.times else None


class EventTimes:
    """Publish and apply times of the last ``capacity`` indices of one node.

    ``published(idx)`` / ``received(idx)`` / ``applied(idx)`` record ``clock()`` now
    (amortised O(1), never raise);
    ``since(idx)`` returns a copy. ``capacity`` must be ≥ 1 (ValueError otherwise)."""

    def __init__(self, node_id: str, capacity: int = DEFAULT_CAPACITY, clock: Callable[[], float] = time.monotonic) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.node_id = node_id
        self.clock = clock
        self._published = _Ring(capacity)
        self._received = _Ring(capacity)
        self._applied = _Ring(capacity)

    @property
    def capacity(self) -> int:
        return self._published.capacity

    def published(self, idx: int) -> None:
        self._published.record(idx, self.clock())

    def received(self, idx: int) -> None:
        """Record the first receipt of ``idx`` (later copies keep the first time)."""
        self._received.record(idx, self.clock(), keep_first=True)

    def applied(self, idx: int) -> None:
        self._applied.record(idx, self.clock())

    def since(self, idx: int = 0) -> EventTimesView:
        return EventTimesView(
            node_id=self.node_id,
            clock="CLOCK_MONOTONIC",
            unit="s",
            since=idx,
            capacity=self.capacity,
            oldest_published=self._published.oldest(),
            oldest_applied=self._applied.oldest(),
            published=self._published.since(idx),
            received=self._received.since(idx),
            applied=self._applied.since(idx),
        )
