"""Whether a runner is dead or stuck (pure rules; docs/architecture.md#rules, runner liveness).

Two separate questions, from the runner's messages (``worker.runner.pulse`` sends a heartbeat
every second from a thread the compute does not block):

- **silent**: nothing at all came from the runner for ``silence_bound`` seconds (10 s once
  serving, 60 s while loading or warming up, when a library may hold the GIL for long). A
  stopped (SIGSTOP), frozen or swapped-out process is silent however its work goes. The
  time the node's own loop was stalled meanwhile (``own_stall``: the node stopped or starved
  of CPU, so it read nothing) is not the runner's silence, up to one bound (as for peers,
  ``exo_p2p.cluster.liveness``): a node SIGSTOPped for 10 s killed its live runner as silent.
  And the node judges only after it ran ``LISTEN_AFTER_STALL`` s since it last heard the
  runner (two of its heartbeats: what waited in the pipe is read first).
- **stuck**: the heartbeats come, but one unit of work never ends. An engine step (a prefill
  chunk or a decode step) or an agreement round is stuck past ``max(floor, factor × the
  longest recent step)`` — the bound scales with the work a step measurably takes on this
  machine and model (warm-up steps included), and the floor (45 s) leaves room for the machine
  slowing down several-fold after those steps were measured. A rank blocked in a collective
  whose peer vanished (a dropped link) is stuck this way. Loading is stuck when no layer
  loaded for ``unit_bound`` (60 s), warm-up when no warm-up step ended for as long; handling a
  message, the same.

A runner that is only slow is never killed: its steps end, however long they take, as long as
each stays within the bound its own history sets.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from exo_p2p.config import (RUNNER_SILENT_GENERATING, RUNNER_SILENT_LOADING, RUNNER_STEP_FACTOR, RUNNER_STEP_FLOOR,
                            RUNNER_UNIT_BOUND)
from worker.runner.protocol import HeartbeatMsg

LISTEN_AFTER_STALL = 2.0
"""Seconds the node's loop must have run (its stalls aside) since a runner was last heard
before the runner counts as silent: two runner heartbeats (``worker.runner.pulse``)."""

_LOADING_TAGS = ("idle", "connecting", "connected", "loading", "loaded", "warming_up")
STEP_KINDS = ("step", "round")
"""Units of work whose bound scales with the measured step time."""


class LivenessBounds(NamedTuple):
    """A supervisor's bounds, seconds (defaults from ``exo_p2p.config``): ``generating`` /
    ``loading`` the silence bounds once serving / before (``silence_bound``), ``step_floor`` and
    ``step_factor`` a step's or round's bound (``step_bound``), ``unit_bound`` any other unit's."""

    generating: float = RUNNER_SILENT_GENERATING
    loading: float = RUNNER_SILENT_LOADING
    step_floor: float = RUNNER_STEP_FLOOR
    step_factor: float = RUNNER_STEP_FACTOR
    unit_bound: float = RUNNER_UNIT_BOUND
    stalled: Callable[[float, float], float] | None = None
    """The node's own loop stalls between two ``time.monotonic`` times
    (``exo_p2p.node.loop_watch``): not a runner's silence (None: not measured)."""


class Fault(NamedTuple):
    """Why a runner is killed: ``kind`` "silent" or "stuck", ``reason`` the sentence for its
    ``Failed`` status and the log."""

    kind: str
    reason: str


def own_stall(bounds: LivenessBounds, silent_for: float) -> float:
    """Seconds the node's own loop was stalled in the last ``silent_for`` s (0.0 when
    ``bounds.stalled`` is None). Reads the monotonic clock: the edge of ``liveness_fault``."""
    if bounds.stalled is None:
        return 0.0
    now = time.monotonic()
    return bounds.stalled(now - silent_for, now)


def liveness_fault(status_tag: str, silent_for: float, beat: HeartbeatMsg | None, beat_age: float,
                   bounds: LivenessBounds, own_stall: float = 0.0) -> Fault | None:
    """Whether a runner whose status is ``status_tag``, last heard ``silent_for`` seconds ago,
    whose last heartbeat ``beat`` came ``beat_age`` seconds ago (None: none yet), is to be
    killed now, and why; None when it lives. ``own_stall``: seconds the node's own loop was
    stalled within those ``silent_for`` (not counted, up to one bound: module docstring)."""
    bound = silence_bound(status_tag, generating=bounds.generating, loading=bounds.loading)
    own_stall = max(0.0, own_stall)
    if silent_for - min(bound, own_stall) > bound and silent_for - own_stall >= LISTEN_AFTER_STALL:
        return Fault("silent", f"runner silent for {silent_for:.0f} s (bound {bound:.0f} s) while {status_tag}; killed")
    if beat is None:
        return None
    reason = stuck_reason(beat, beat_age, floor=bounds.step_floor, factor=bounds.step_factor, unit_bound=bounds.unit_bound)
    return None if reason is None else Fault("stuck", f"runner stuck: {reason} while {status_tag}; killed")


def silence_bound(status_tag: str, *, generating: float, loading: float) -> float:
    """Seconds a runner whose status is ``status_tag`` may send nothing at all before it is
    killed as silent: ``loading`` before it is ready, ``generating`` after."""
    return loading if status_tag in _LOADING_TAGS else generating


def step_bound(longest_step: float, *, floor: float, factor: float) -> float:
    """Seconds one engine step or agreement round may last: ``max(floor, factor ×
    longest_step)`` (``longest_step``: the longest recent step, seconds)."""
    return max(floor, factor * longest_step)


def stuck_reason(beat: HeartbeatMsg, age: float, *, floor: float, factor: float, unit_bound: float) -> str | None:
    """Why a runner whose last heartbeat was ``beat``, received ``age`` seconds ago, is stuck;
    None when it is not (idle, or its unit of work is within its bound)."""
    if not beat.busy:
        return None
    busy_for = beat.busy_for + max(0.0, age)
    if beat.busy in STEP_KINDS:
        bound = step_bound(beat.longest_step, floor=floor, factor=factor)
        if busy_for <= bound:
            return None
        what = "engine step" if beat.busy == "step" else "agreement round"
        return (f"one {what} ran for {busy_for:.0f} s without ending (bound {bound:.0f} s: "
                f"the larger of {floor:g} s and {factor:g} x its longest recent step, {beat.longest_step:.1f} s)")
    if busy_for <= unit_bound:
        return None
    what = {"load": "while loading (no layer loaded)", "warmup": "while warming up (no warm-up step ended)",
            "connect": "while connecting its ring"}.get(beat.busy, f"in one {beat.busy}")
    return f"no progress for {busy_for:.0f} s {what} (bound {unit_bound:g} s)"
