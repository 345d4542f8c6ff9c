"""Tests only: the faults ``--fault-hook`` injects into a runner, kept out of its code paths.

A runner started without fault hooks gets ``NO_FAULTS``, whose methods do nothing. Keys
(``RunnerSetup.fault_hooks``): ``fail=loading`` raises at the start of the load (the runner
reports ``Failed``); ``stall=loading`` / ``stall=warmup`` hangs there (its supervisor kills it
when silent past its bound, ``config.RUNNER_SILENT_LOADING``); ``ring=no_hostfile`` drops the
ring's host list (a ring that must fail to form); ``slow_step=SECONDS`` makes the first
serving step take that much longer (a long step, not a dead runner: ``worker.liveness``). The same seam for gossip and chunks is
``exo_p2p.cluster.faults``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

STALL_SECONDS = 3600.0
"""How long a stalled runner hangs: far beyond any silence bound, so it is killed first."""

STAGE_LOADING = "loading"
STAGE_WARMUP = "warmup"


@dataclass
class RunnerFaults:
    """The faults one runner injects (module docstring): ``fail``/``stall``/``ring`` a stage
    name or None, ``slow_step`` seconds added to the first serving step (0: none)."""

    fail: str | None = None
    stall: str | None = None
    ring: str | None = None
    slow_step: float = 0.0

    @classmethod
    def from_hooks(cls, hooks: Mapping[str, str]) -> RunnerFaults:
        """Raises ``ValueError`` for a ``slow_step`` that is not a number of seconds."""
        return cls(fail=hooks.get("fail"), stall=hooks.get("stall"), ring=hooks.get("ring"),
                   slow_step=float(hooks.get("slow_step", 0.0)))

    def before_step(self, sleep: Callable[[float], None] = time.sleep) -> None:
        """Called before each serving step: the first one sleeps ``slow_step`` seconds."""
        if self.slow_step > 0:
            seconds, self.slow_step = self.slow_step, 0.0
            sleep(seconds)

    def at(self, stage: str, sleep: Callable[[float], None] = time.sleep) -> None:
        """Called when the runner reaches ``stage``: raise or hang there when asked to.
        Raises ``RuntimeError`` for ``fail=<stage>``."""
        if self.fail == stage:
            raise RuntimeError(f"fault hook: failure during {'load' if stage == STAGE_LOADING else stage}")
        if self.stall == stage:
            sleep(STALL_SECONDS)

    def ring_addresses(self, addresses: Sequence[T]) -> Sequence[T] | None:
        """The ring's host list, or None with ``ring=no_hostfile``."""
        return None if self.ring == "no_hostfile" else addresses


NO_FAULTS = RunnerFaults()
