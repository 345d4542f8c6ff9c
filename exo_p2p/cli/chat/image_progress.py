"""``exo-p2p image``'s stream (docs/images.md#progress): the node's image events read into the
answer, with a progress bar on stderr that moves at every ``image_generation.progress`` (or
``image_edit.progress``) event. The bar is rich's, as the other commands' bars; a stderr that
is not a terminal gets no bar.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from exo_p2p.cli.errors import CliError


def follow(events: Iterable[str], steps: int | None, console: Console | None = None) -> dict:
    """The answer of an image stream ``events`` (each SSE data payload, JSON): ``{"data":
    [{"b64_json"}], "size", "output_format", "usage"}`` from its ``.completed`` event; the bar
    counts ``steps`` (until the first progress event says how many). Raises ``CliError`` for
    the stream's ``error`` event, a payload that is not JSON, or a stream that ends without
    its image. ``console``: where the bar goes (stderr's by default)."""
    console = console or Console(stderr=True)
    with Progress(TextColumn("denoising"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                  transient=True, auto_refresh=False, disable=not console.is_terminal) as bar:
        tick = bar.add_task("denoising", total=steps)
        for data in events:
            try:
                event = json.loads(data)
            except ValueError:
                raise CliError("the node's image stream sent something that is not JSON") from None
            kind = str(event.get("type", ""))
            if kind.endswith(".progress"):
                bar.update(tick, completed=int(event.get("step", 0)), total=int(event.get("steps") or 0) or None)
                bar.refresh()  # drawn at each step, not on a timer
            elif kind.endswith(".completed"):
                return {"data": [{"b64_json": event.get("b64_json")}], "size": event.get("size"),
                        "output_format": event.get("output_format"), "usage": event.get("usage")}
            elif kind == "error":
                error = event.get("error") or {}
                raise CliError(f"the node could not make the image: {error.get('message', 'unknown error')}")
    raise CliError("the node's image stream ended without the image")
