"""Tests only: the faults a node's model serving can be told to make (``--fault-hook``).

``model_corrupt_chunks=N`` (``exo_p2p.models.transfer.protocols.HOOK_CORRUPT_CHUNKS``) serves the
first N chunks read with one bit flipped; ``model_serve_delay=S`` sleeps S seconds before
each chunk (a slow holder, so a test can stop a transfer midway). Kept at this one seam:
with no hook set, ``ServeFaults.wrap`` hands back the source itself.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import structlog

from exo_p2p.models.transfer.protocols import HOOK_CORRUPT_CHUNKS, ChunkSource

log = structlog.get_logger(__name__)

HOOK_SERVE_DELAY = "model_serve_delay"


class FaultySource:
    """``inner`` with the faults: the first ``budget[0]`` chunks read (shared by every source
    wrapped by one ``ServeFaults``, decremented here) get a bit flipped; each read sleeps
    ``delay`` seconds first. Reads run in worker threads."""

    def __init__(self, inner: ChunkSource, budget: list[int], delay: float) -> None:
        self.inner, self.manifest, self._budget, self._delay = inner, inner.manifest, budget, delay

    def read_chunk(self, path: str, index: int) -> bytes:
        """``inner``'s chunk, after the delay, with a bit flipped while the budget lasts."""
        if self._delay > 0:
            time.sleep(self._delay)
        data = self.inner.read_chunk(path, index)
        if self._budget[0] > 0 and data:
            self._budget[0] -= 1
            log.warning("fault hook: serving a corrupted chunk", path=path, index=index)
            return bytes([data[0] ^ 1]) + data[1:]
        return data


class ServeFaults:
    """The serving faults of one node, read from its ``--fault-hook`` values (hook name ->
    value; module docstring)."""

    def __init__(self, fault_hooks: Mapping[str, str] | None) -> None:
        self._corrupt = [int((fault_hooks or {}).get(HOOK_CORRUPT_CHUNKS, 0))]
        self._delay = float((fault_hooks or {}).get(HOOK_SERVE_DELAY, 0))

    def wrap(self, source: ChunkSource | None) -> ChunkSource | None:
        """``source`` behind a ``FaultySource`` while a fault is left to make, else itself."""
        if source is not None and (self._corrupt[0] > 0 or self._delay > 0):
            return FaultySource(source, self._corrupt, self._delay)
        return source
