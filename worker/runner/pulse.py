"""What a runner is doing right now, and the heartbeat thread that reports it.

A runner's liveness must not depend on how long its compute takes (a long prefill chunk of a
large model on a loaded machine takes longer than any fixed bound): the heartbeat comes from
its own thread, which MLX's evaluation does not block (``mx.eval`` releases the GIL), and
says what the main thread is busy with and for how long (docs/architecture.md#rules, runner
liveness). The supervisor's rule (``worker.liveness``) decides from it whether the runner is
stuck: a stopped process sends nothing (silence), a wedged one reports one unit of work that
never ends.

Units of work (``Pulse.begin``): ``step`` (one engine step: a prefill chunk or a decode step
of the batch), ``round`` (one agreement round of a multi-rank instance), ``load`` (reset at
every layer loaded), ``warmup`` (reset at every warm-up step), ``connect`` (the ring's own
timeout bounds it), ``task`` (handling one message from the node). Durations of ``step`` and
of warm-up steps are kept: the longest of the recent ones scales the stuck bound.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from exo_p2p.types.observe import EngineStats
from worker.runner.protocol import HeartbeatMsg

RECENT_STEPS = 256
"""Steps whose durations are kept (the longest of them scales the stuck bound)."""


class Pulse:
    """The main thread's current unit of work and its recent step durations (thread-safe:
    the main thread writes, the heartbeat thread reads). ``clock``: monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, recent: int = RECENT_STEPS) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._kind = ""
        self._since = 0.0
        self._recent: deque[float] = deque(maxlen=recent)
        self._warmup_longest = 0.0
        self.stats: EngineStats | None = None
        """The engine's last figures (set by the main thread, sent with each heartbeat)."""

    def report(self, stats: EngineStats) -> None:
        """The engine's figures now (the main thread's; sent with the next heartbeat)."""
        with self._lock:
            self.stats = stats

    def begin(self, kind: str) -> None:
        """The main thread starts a unit of work of ``kind`` (module docstring)."""
        with self._lock:
            self._kind, self._since = kind, self._clock()

    def progress(self) -> None:
        """The current unit made progress (a layer loaded, a warm-up step done): its age
        starts again."""
        with self._lock:
            self._since = self._clock()

    def end(self) -> None:
        """The unit is over: the runner waits for input (not busy)."""
        with self._lock:
            self._kind = ""

    @contextmanager
    def unit(self, kind: str) -> Iterator[None]:
        """``begin(kind)`` … ``end()``; a ``step`` unit's duration is recorded."""
        self.begin(kind)
        started = self._clock()
        try:
            yield
        finally:
            if kind == "step":
                self.record(self._clock() - started)
            self.end()

    def record(self, seconds: float, *, warmup: bool = False) -> None:
        """One step took ``seconds``; warm-up steps are kept for the runner's life (they
        include first-use costs, and the bound must never fall below them)."""
        with self._lock:
            if warmup:
                self._warmup_longest = max(self._warmup_longest, seconds)
            else:
                self._recent.append(seconds)

    def beat(self) -> HeartbeatMsg:
        """The heartbeat now: the unit's kind ("" idle), its age in seconds, and the longest
        recent step (warm-up steps included) in seconds."""
        with self._lock:
            longest = max(self._recent, default=0.0)
            longest = max(longest, self._warmup_longest)
            busy_for = self._clock() - self._since if self._kind else 0.0
            return HeartbeatMsg(busy=self._kind, busy_for=round(busy_for, 3), longest_step=round(longest, 3),
                                stats=self.stats)


def heartbeat_loop(pulse: Pulse, send: Callable[[object], None], interval: float,
                   sleep: Callable[[float], None] = time.sleep) -> None:
    """Send ``pulse.beat()`` every ``interval`` seconds, forever (a daemon thread's body). A
    failed send (the node closed the pipe) ends the loop: the main thread exits by itself."""
    while True:
        sleep(interval)
        try:
            send(pulse.beat())
        except OSError:
            return


def start_heartbeat(pulse: Pulse, send: Callable[[object], None], interval: float) -> threading.Thread:
    """Start ``heartbeat_loop`` in a daemon thread and return it."""
    thread = threading.Thread(target=heartbeat_loop, args=(pulse, send, interval), name="runner-heartbeat", daemon=True)
    thread.start()
    return thread
