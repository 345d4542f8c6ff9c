"""Image streams the node tests leave or break midway (tests/test_image_node.py,
tests/test_image_pipeline_nodes.py): a 50-step 128² stream with 3 partial images (the first
after step 12), left after its first partial, or with a runner killed at that point."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

LONG_STREAM = {"size": "128x128", "steps": 50, "seed": 1, "stream": True, "partial_images": 3}
"""The long stream's body, beside ``model`` and ``prompt``."""


def left_after_first_partial(url: str, model: str, prompt: str) -> float:
    """Start the long stream at node ``url``, leave it at its first partial image; the
    seconds that partial took."""
    started = time.monotonic()
    body = {"model": model, "prompt": prompt, **LONG_STREAM}
    with httpx.stream("POST", f"{url}/v1/images/generations", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("event: image_generation.partial_image"):
                break
    return time.monotonic() - started


def killed_after_first_partial(url: str, model: str, prompt: str, kill: Callable[[], None]) -> tuple[list[str], float]:
    """Start the long stream, call ``kill()`` at its first partial image and read the stream
    to its end: its event types and the seconds from the kill to the end."""
    events: list[str] = []
    body = {"model": model, "prompt": prompt, **LONG_STREAM}
    with httpx.stream("POST", f"{url}/v1/images/generations", json=body, timeout=300) as r:
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("event: "):
                events.append(line[7:])
                if events[-1] == "image_generation.partial_image":
                    break
        kill()
        killed = time.monotonic()
        events += [line[7:] for line in lines if line.startswith("event: ")]
    return events, time.monotonic() - killed
