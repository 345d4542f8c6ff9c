"""Whether a model's re-placement is visibly progressing (pure; ``exo_p2p.api.generation.resume``).

A request waiting for a re-placement (a moved continuation, or a new request refused while
the model's instances are re-placed) waits ``MOVE_BOUND`` seconds, and longer — up to
``PROGRESS_BOUND`` — while the re-placement keeps making progress: its runners fetch bytes,
load layers or move through their lifecycle, each change seen within ``PROGRESS_FRESH``
seconds of the last. A load that takes 42 s on a busy machine, after a 5 s node timeout and a
backoff, no longer fails the requests that wait for it; one that stalls still does.

No clock, no I/O: callers pass seconds on any monotonic clock.
"""

from __future__ import annotations

from exo_p2p.types import RunnerDownloading, RunnerLoading, State

PROGRESS_BOUND = 300.0
"""Seconds after a failure a request waits at most for a re-placement that keeps progressing."""

PROGRESS_FRESH = 30.0
"""Seconds since the re-placement's last visible progress within which it counts as
progressing (a layer of a large model on a busy machine, a chunk of a fetch)."""

Mark = tuple[tuple[str, str, int], ...]


def progress_mark(state: State, model_id: str) -> Mark:
    """What the not-yet-ready instances of ``model_id`` that are not failed have done so far:
    one ``(runner_id, status tag, units)`` per runner (units: layers loaded, or bytes fetched),
    sorted. Empty when no instance of the model is on its way."""
    marks = []
    for inst in state.instances.values():
        if inst.model_id != model_id or inst.failed_reason is not None:
            continue
        for runner_id, runner in state.runners.items():
            if runner.instance_id != inst.instance_id:
                continue
            status = runner.status
            tag = type(status).__struct_config__.tag  # type: ignore[attr-defined]
            if tag in ("ready", "running"):
                continue
            units = status.layers_loaded if isinstance(status, RunnerLoading) else (
                status.bytes_done if isinstance(status, RunnerDownloading) else 0)
            marks.append((str(runner_id), str(tag), int(units)))
    return tuple(sorted(marks))


class ProgressAge:
    """Seconds since a re-placement's ``progress_mark`` last changed, fed one mark at a time."""

    def __init__(self, now: float) -> None:
        self._mark: Mark | None = None
        self._changed = now

    def age(self, mark: Mark, now: float) -> float | None:
        """Seconds since ``mark`` (the mark now) last changed; None when nothing is on its way
        (an empty mark)."""
        if not mark:
            return None
        if mark != self._mark:
            self._mark, self._changed = mark, now
        return now - self._changed
