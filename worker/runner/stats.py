"""A runner's ``EngineStats``: what its engine holds and has done, read by the main thread
between steps and sent with the next heartbeat (``worker.runner.pulse``), at most every
``STATS_EVERY`` seconds (the sums walk the batch's rows and the prompt cache's entries)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from exo_p2p.types.observe import EngineStats

STATS_EVERY = 0.5
"""Seconds between two readings of the engine's figures at most."""
PREFIX_MIN_GAP = 0.2
"""Seconds between two publications of a runner's prefix digests on average at least (each
is one event in the cluster's log: ``InstancePrefixesUpdated``)."""
PREFIX_BURST = 8
"""Publications a runner may make at once before ``PREFIX_MIN_GAP`` holds: a conversation's
quick turns (or an agent's steps) each publish before the next turn is routed; a flood of
finishing requests is held to one publication per gap."""


def engine_stats(engine: Any, kv_bytes_per_token: int, generated: int = 0) -> EngineStats:
    """The figures of ``engine`` (a ``worker.engine.scheduler.Engine``) now; call it from the
    thread that steps the engine. ``kv_bytes_per_token``: this rank's KV bytes per token;
    ``generated``: tokens the runner sampled for requests so far."""
    rows = [row.kv().used for row in engine.batch.rows]
    rows += [int(seq.processed) for seq in engine.slots.rows]  # prefilling or paused
    cache = engine.prompt_cache
    disk = cache.disk
    spec = getattr(getattr(engine.batch, "spec", None), "stats", None)  # a SpecStats when drafting
    return EngineStats(
        queued=len(engine.queued_task_ids), batch_rows=engine.batch_size, batch_limit=engine.settings.max_batch,
        kv_tokens=sum(rows), kv_capacity_tokens=engine.kv_capacity_tokens, kv_bytes_per_token=kv_bytes_per_token,
        cache_tokens=cache.tokens, cache_bound_tokens=cache.max_tokens, cache_hits_total=cache.hits,
        cache_misses_total=cache.misses, reused_tokens_total=cache.reused_tokens,
        prefilled_tokens_total=engine.prefilled_tokens, generated_tokens_total=generated,
        cache_disk_hits_total=cache.disk_hits, cache_restored_tokens_total=cache.restored_tokens,
        **({} if disk is None else {"cache_disk_bytes": disk.nbytes, "cache_disk_blocks": disk.blocks,
                                    "cache_disk_rejected_total": disk.rejected, "cache_disk_writable": disk.writable}),
        draft_proposed_total=spec.proposed if spec else 0, draft_accepted_total=spec.accepted if spec else 0,
    )


class StatsClock:
    """Whether the figures are due again (``STATS_EVERY`` seconds since the last reading)."""

    def __init__(self, every: float = STATS_EVERY, clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self._clock, self._last = every, clock, float("-inf")

    def due(self, force: bool = False) -> bool:
        """True (and the clock restarts) when due or ``force``."""
        now = self._clock()
        if force or now - self._last >= self.every:
            self._last = now
            return True
        return False


class PrefixPublisher:
    """When to publish the prompt cache's prefix digests: at once when they changed and a
    token of a bucket of ``burst`` (refilled one per ``gap`` seconds) is left, else later
    (``flush``, once a token is back)."""

    def __init__(self, gap: float = PREFIX_MIN_GAP, clock: Callable[[], float] = time.monotonic,
                 burst: int = PREFIX_BURST) -> None:
        self.gap, self._clock, self.burst = gap, clock, burst
        self.sent: tuple[int, ...] = ()
        self.pending: tuple[int, ...] | None = None
        self._tokens = float(burst)
        self._last = clock()

    def offer(self, digests: tuple[int, ...]) -> tuple[int, ...] | None:
        """The digests to publish now, or None (unchanged, or kept until a token is back)."""
        if digests == self.sent:
            self.pending = None
            return None
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) / self.gap)
        self._last = now
        if self._tokens < 1:
            self.pending = digests
            return None
        self._tokens -= 1
        self.sent, self.pending = digests, None
        return digests

    def flush(self) -> tuple[int, ...] | None:
        """The digests kept back, once their gap passed; None otherwise."""
        return self.offer(self.pending) if self.pending is not None else None
