"""Wait for a placed instance to be ready, showing its phase (preparing, connecting
ranks, loading layers, warming up) and layers loaded / total as a progress bar whose clock
keeps running until the instance is ready."""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console
from datetime import timedelta

from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn
from rich.text import Text

from exo_p2p.cli.client import ApiError, CliError, NodeClient

POLL_INTERVAL = 0.5
"""Seconds between two ``GET /instances/{id}`` while waiting."""


PHASES = (
    ("preparing", ("pending",)),  # importing the model file if needed, starting runners
    ("connecting ranks", ("idle", "connecting", "connected")),
    ("loading layers", ("loading",)),
    ("warming up", ("loaded", "warming_up")),
    ("ready", ("ready", "running")),
)
"""Phases of a loading instance, in order, with the runner statuses that are in each."""


def instance_phase(instance: dict) -> str:
    """The phase of ``instance`` (an ``/instances`` item): that of its least advanced shard
    (``PHASES``); ``"ready"`` once the instance is; ``"loading layers"`` when the shards'
    statuses are unknown."""
    if instance.get("status") == "ready":
        return "ready"
    order = {status: i for i, (_, statuses) in enumerate(PHASES) for status in statuses}
    ranks = [order[s["status"]] for s in instance.get("shards") or [] if s.get("status") in order]
    return PHASES[min(ranks)][0] if ranks else "loading layers"


class _Clock(ProgressColumn):
    """Time since the wait began; unlike rich's ``TimeElapsedColumn`` it does not stop when
    the bar is full (all layers loaded, warming up)."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed or 0.0
        return Text(str(timedelta(seconds=int(elapsed))), style="progress.elapsed")


def wait_until_ready(
    client: NodeClient,
    instance: dict,
    *,
    timeout: float,
    console: Console,
    poll_interval: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict:
    """Poll ``instance`` (as ``POST /instances`` returned it) until its status is ``ready``;
    return its last state.

    The bar (on ``console``, normally stderr) shows layers loaded / total of the whole
    instance; it polls every ``poll_interval`` seconds (default ``POLL_INTERVAL``).
    Raises ``CliError`` when the instance fails (with the node's reason), disappears
    (deleted) or is not ready within ``timeout`` seconds.
    """
    poll_interval = POLL_INTERVAL if poll_interval is None else poll_interval
    instance_id = instance["instance_id"]
    deadline = clock() + timeout
    current = instance
    with Progress(
        TextColumn("[bold]{task.description}"),
        TextColumn("{task.fields[phase]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("layers"),
        _Clock(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task(str(instance.get("model", instance_id)), total=None, phase=instance_phase(instance))
        shown_phase = None
        while True:
            total = current.get("layers_total") or None
            phase = instance_phase(current)
            progress.update(task, total=total, completed=current.get("layers_loaded") or 0, phase=phase)
            if phase != shown_phase and not console.is_terminal:
                # no live bar outside a terminal: one line per phase instead
                console.print(f"{instance.get('model', instance_id)}: {phase}")
            shown_phase = phase
            status = current.get("status")
            if status == "ready":
                if total:
                    progress.update(task, completed=total)
                return current
            if status == "failed":
                raise CliError(
                    f"instance {instance_id} of {current.get('model')} failed: "
                    f"{current.get('reason') or 'no reason given'}"
                )
            if clock() >= deadline:
                raise CliError(
                    f"instance {instance_id} is not ready after {timeout:g} s "
                    f"(status {status}, {current.get('layers_loaded', 0)}/"
                    f"{current.get('layers_total', '?')} layers); it keeps loading — "
                    "see `exo-p2p instances`"
                )
            sleep(poll_interval)
            try:
                current = client.instance(instance_id)
            except ApiError as e:
                if e.status == 404:
                    raise CliError(f"instance {instance_id} was deleted while loading") from e
                raise
