"""Wait for a placed instance to be ready, showing its phase (preparing, downloading shards,
starting runners, connecting ranks, loading layers, warming up) as a progress bar whose clock
keeps running until the instance is ready: bytes fetched / total and the speed while some
rank fetches its shard from peers (docs/models.md), then layers loaded / total."""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console
from datetime import timedelta

from rich.progress import BarColumn, Progress, ProgressColumn, Task, TaskID, TextColumn
from rich.text import Text

from exo_p2p.cli.node_api.client import NodeClient
from exo_p2p.cli.errors import ApiError, CliError
from exo_p2p.cli.output.readable import size_text, source_split

POLL_INTERVAL = 0.5
"""Seconds between two ``GET /instances/{id}`` while waiting."""


PHASES = (
    ("preparing", ("pending",)),  # importing the model file if needed
    ("downloading shards", ("downloading",)),  # a node lacking the model fetches its shard
    # a runner process is up and imports MLX and mlx-lm (seconds on a busy machine); a rank
    # of a multi-rank instance also waits there for the other ranks' runners
    ("starting runners", ("idle",)),
    ("connecting ranks", ("connecting", "connected")),  # the ranks' ring: multi-rank instances only
    ("loading layers", ("loading",)),
    ("warming up", ("loaded", "warming_up")),
    ("ready", ("ready", "running")),
)
"""Phases of a loading instance, in order, with the runner statuses that are in each. A
single-rank runner goes from idle to loading (``worker.plan``), so its instance never shows
"connecting ranks"."""


def instance_phase(instance: dict) -> str:
    """The phase of ``instance`` (an ``/instances`` item): that of its least advanced shard
    (``PHASES``); ``"ready"`` once the instance is; ``"loading layers"`` when the shards'
    statuses are unknown."""
    if instance.get("status") == "ready":
        return "ready"
    order = {status: i for i, (_, statuses) in enumerate(PHASES) for status in statuses}
    ranks = [order[s["status"]] for s in instance.get("shards") or [] if s.get("status") in order]
    return PHASES[min(ranks)][0] if ranks else "loading layers"


class _Amount(ProgressColumn):
    """``M/N layers``, or while shards download ``3.2 MiB/8.0 MiB 1.5 MiB/s``."""

    def render(self, task: Task) -> Text:
        if task.fields.get("unit") == "bytes":
            speed = task.fields.get("speed") or 0.0
            split = source_split(task.fields.get("from_peers") or 0, task.fields.get("from_hub") or 0)
            return Text(f"{size_text(task.completed)}/{size_text(task.total or 0)} {size_text(speed)}/s{split}",
                        style="progress.download")
        total = "?" if task.total is None else f"{int(task.total)}"
        return Text(f"{int(task.completed)}/{total} layers", style="progress.download")


def download_figures(instance: dict) -> tuple[int, int, float, int, int] | None:
    """(bytes done, bytes total, bytes/s, bytes from peers, bytes from the hub) summed over the
    shards downloading, or None."""
    shards = [s for s in instance.get("shards") or [] if s.get("status") == "downloading"]
    if not shards:
        return None
    return (sum(s.get("bytes_done") or 0 for s in shards), sum(s.get("bytes_total") or 0 for s in shards),
            sum(s.get("bytes_per_second") or 0.0 for s in shards),
            sum(s.get("bytes_from_peers") or 0 for s in shards), sum(s.get("bytes_from_hub") or 0 for s in shards))


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
    with _bar(console) as progress:
        task = progress.add_task(str(instance.get("model", instance_id)), total=None, phase=instance_phase(instance),
                                 unit="layers", speed=0.0)
        shown_phase = None
        while True:
            phase = show_figures(progress, task, current)
            if phase != shown_phase and not console.is_terminal:
                # no live bar outside a terminal: one line per phase instead
                console.print(f"{instance.get('model', instance_id)}: {phase}")
            shown_phase = phase
            status = current.get("status")
            if status == "ready":
                if total := current.get("layers_total") or None:
                    progress.update(task, completed=total)
                return current
            if status == "failed":
                raise CliError(
                    f"instance {instance_id} of {current.get('model')} failed: "
                    f"{current.get('reason') or 'no reason given'}"
                )
            if clock() >= deadline:
                raise not_ready_error(instance_id, current, timeout)
            sleep(poll_interval)
            current = _poll(client, instance_id)


def _bar(console: Console) -> Progress:
    """The wait's progress bar: model, phase, bar, amount (``_Amount``) and clock (``_Clock``)."""
    return Progress(TextColumn("[bold]{task.description}"), TextColumn("{task.fields[phase]}"), BarColumn(), _Amount(),
                    _Clock(), console=console, transient=False)


def show_figures(progress: Progress, task: TaskID, current: dict) -> str:
    """Put ``current``'s figures on the bar: bytes while some shard downloads, else layers
    loaded / total. Returns its phase (``instance_phase``)."""
    phase = instance_phase(current)
    download = download_figures(current)
    if download is not None and download[1] > 0:
        progress.update(task, total=download[1], completed=download[0], phase=phase, unit="bytes",
                        speed=download[2], from_peers=download[3], from_hub=download[4])
    else:
        progress.update(task, total=current.get("layers_total") or None, completed=current.get("layers_loaded") or 0,
                        phase=phase, unit="layers")
    return phase


def not_ready_error(instance_id: str, current: dict, timeout: float) -> CliError:
    """The error of a wait that ran out: the instance's status and layers so far."""
    return CliError(
        f"instance {instance_id} is not ready after {timeout:g} s "
        f"(status {current.get('status')}, {current.get('layers_loaded', 0)}/"
        f"{current.get('layers_total', '?')} layers); it keeps loading — "
        "see `exo-p2p instances`"
    )


def _poll(client: NodeClient, instance_id: str) -> dict:
    """The instance's state now. Raises ``CliError`` when it is gone (404: deleted)."""
    try:
        return client.instance(instance_id)
    except ApiError as e:
        if e.status == 404:
            raise CliError(f"instance {instance_id} was deleted while loading") from e
        raise
