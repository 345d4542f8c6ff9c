"""The runner's lifecycle tasks over the seam: join the ring, load the shard, warm up (docs/architecture.md#vocabulary).

``ConnectToGroup`` → ``connect`` (multi-rank only), ``LoadModel`` → ``load``, ``StartWarmup``
→ ``warmup``: each drives the runner's ``Builder`` (``worker.engine.base``; which one:
``worker.runner.builders``) and reports the runner's status as it goes through ``report``
(``RunnerProcess.set_status``). They know the runner only through their arguments and return
what they made; an exception fails the runner (``RunnerProcess.handle_item``).
"""

from __future__ import annotations

from collections.abc import Callable

from exo_p2p.types import (RunnerConnected, RunnerConnecting, RunnerFailed, RunnerLoaded, RunnerLoading, RunnerReady,
                          RunnerStatus, RunnerWarmingUp)
from worker.engine.base import Builder, Engine
from worker.runner.protocol import RunnerSetup, StatusMsg, frame
from worker.runner.pulse import Pulse
from worker.runner.rounds import Rounds

Report = Callable[[RunnerStatus], None]


def connect(builder: Builder, report: Report, out_fd: int) -> None:
    """Join the instance's ring; a ring that does not form in time is reported as
    ``RunnerFailed`` on ``out_fd`` by the ring's watchdog (``engine.distributed.init_ring``)."""
    report(RunnerConnecting())
    builder.connect(lambda message: (out_fd, frame(StatusMsg(RunnerFailed(message)))))
    report(RunnerConnected())


def load(builder: Builder, report: Report, pulse: Pulse, setup: RunnerSetup) -> None:
    """Load this rank's share, reporting ``RunnerLoading`` from the start (the imports of
    MLX and mlx-lm take seconds on a busy machine: that is loading too) and at each layer."""
    report(RunnerLoading(0, setup.shard.end_layer - setup.shard.start_layer))
    for done, total in builder.load():
        pulse.progress()
        report(RunnerLoading(done, total))
    report(RunnerLoaded(peak_memory_bytes=builder.peak_memory_bytes()))


def warmup(builder: Builder, report: Report, pulse: Pulse, setup: RunnerSetup,
           built: Callable[[Engine], None]) -> tuple[Engine, Rounds | None]:
    """Report WarmingUp; build and warm up the engine (each warm-up step kept for the stuck
    bound), then call ``built(engine)`` (its first figures); on a multi-rank instance agree
    the rounds' pace (a collective); report Ready. Returns the engine and the rounds (None on
    one rank)."""
    report(RunnerWarmingUp())

    def on_step(seconds: float) -> None:
        pulse.record(seconds, warmup=True)
        pulse.progress()

    engine = builder.build(on_step)
    built(engine)
    rounds = None
    if setup.shard.world_size > 1:  # the pace is the same on every rank: the slowest rank's
        if builder.all_gather is None:
            raise RuntimeError("a multi-rank builder gave no all-gather")
        rounds = Rounds.agreed(builder.all_gather, setup.engine.max_batch, engine.warmup_rate)
    report(RunnerReady())
    return engine, rounds
