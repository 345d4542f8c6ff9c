"""The builder: the engine made once, from the runner's settings and its loaded shard.

``build_engine`` turns ``EngineSettings`` and a ``LoadedModel`` into an ``Engine`` with its
parts fixed: the stage (the whole model, or this rank's part of a pipeline or tensor
instance), the batch's KV capacity (tokens: ``batch_memory.capacity_tokens`` of the KV budget
beside the prompt cache) and the prompt cache's bound (tokens: ``prompt_cache_bytes`` ÷ this
rank's KV bytes per token). On a multi-rank instance (``ring``) the capacity and the bound
are the smallest rank's, agreed with one all-gather, so every rank admits, keeps and evicts
alike; a prompt cache off on any rank is off on all. So are a pipeline's micro-batches
(``micro``): each rank proposes the setting or the rule, the smallest is kept. Building a
multi-rank engine is a collective: every rank calls it at the same point.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from exo_p2p.types.common import TaskId
from exo_p2p.types.engine import EngineSettings
from worker.engine.batch_memory import capacity_tokens, model_kv_bytes_per_token
from worker.engine.loading.loader import LoadedModel
from worker.engine.micro import auto_micro_batches, resolve_micro_batches
from worker.engine.pipeline import LocalStage, Stage
from worker.engine.prompt_cache import Gather, PromptCache
from worker.engine.ring_wait import NO_WAIT, RingWait
from worker.engine.scheduler import Engine

UNBOUNDED = np.iinfo(np.int64).max
"""The all-gathered stand-in for "no KV capacity bound"."""


@dataclass(frozen=True)
class Ring:
    """This rank's place in a multi-rank instance: its MLX ``group``, the instance's
    ``sharding`` ("pipeline" or "tensor"), whether any rank holds float32 weights (then every
    rank sends float32 between ranks), the ring's all-gather (``int64 [W] -> [world, W]``), and
    ``hosts``: how many distinct hosts the ranks are on (0: unknown; ``micro.auto_micro_batches``),
    and ``wait``: how a pipeline rank waits for its neighbours' turns (``ring_wait``)."""

    group: Any
    sharding: str
    float32: bool
    all_gather: Gather
    hosts: int = 0
    wait: RingWait = NO_WAIT


def ring_stage(loaded: LoadedModel, ring: Ring) -> Stage:
    """This rank's stage of a pipeline or tensor instance (a collective: every rank, same
    point — the pipeline probes the dtype its ranks send)."""
    import mlx.core as mx

    from worker.engine.pipeline import PipelineStage, probe_hidden_dtype
    from worker.engine.tensor import TensorStage

    if ring.sharding == "tensor":
        if ring.float32:
            from worker.engine.loading.dequantize import float32_wire

            float32_wire(loaded.model)
        return TensorStage(ring.group)
    cfg = loaded.config.get("text_config", loaded.config)
    hidden = int(cfg["hidden_size"])
    if ring.float32:
        return PipelineStage(ring.group, hidden, mx.float32, wire_dtype=mx.float32, wait=ring.wait)
    return PipelineStage(ring.group, hidden, probe_hidden_dtype(loaded.model, ring.group, hidden), wait=ring.wait)


def rank_limits(settings: EngineSettings, kv_bytes_per_token: int, transient_bytes: int = 0) -> tuple[int | None, int]:
    """This rank's (batch KV capacity, prompt cache bound), both in tokens (capacity None:
    unbounded; bound 0: no prompt cache). ``kv_bytes_per_token``: as the KV is held (quantized
    with ``kv_cache_bits``); ``transient_bytes``: full-precision KV a prefill chunk holds
    before it is quantized (``prefill_transient_bytes``), taken from the budget first."""
    held = settings.prompt_cache_bytes + transient_bytes
    capacity = capacity_tokens(settings.kv_cache_bytes, held, kv_bytes_per_token)
    bound = settings.prompt_cache_bytes // kv_bytes_per_token if kv_bytes_per_token > 0 else 0
    return capacity, bound


def prefill_transient_bytes(settings: EngineSettings, model: Any) -> int:
    """Full-precision KV a quantized cache's prefill holds beside the cache: the new K and V
    of the most prompt tokens one forward feeds (``prefill.PREFILL_GROUP_TOKENS``, at least a
    chunk) of one layer — the largest of ``model``'s local ones: each layer quantizes its new
    positions as it stores them (``kvq.batch_cache``), so no two layers' are alive at once.
    0 at full precision (the chunk's K and V are the cache's own bytes)."""
    if not settings.kv_cache_bits:
        return 0
    from exo_p2p.models.kv_bytes import token_bytes
    from worker.engine.batch_memory import kv_layout
    from worker.engine.prefill import PREFILL_GROUP_TOKENS

    layer = max((token_bytes(heads, dim, b, 0) for heads, dim, b in kv_layout(model)), default=0)
    return max(PREFILL_GROUP_TOKENS, settings.prefill_chunk_size) * layer


def agree_limits(all_gather: Gather, capacity: int | None, bound: int, micro: int = 1) -> tuple[int | None, int, int]:
    """The smallest rank's (capacity, bound, micro-batches) (a collective: one all-gather)."""
    row = np.array([UNBOUNDED if capacity is None else capacity, bound, micro], dtype=np.int64)
    agreed = all_gather(row).min(axis=0)
    return (None if int(agreed[0]) == UNBOUNDED else int(agreed[0])), int(agreed[1]), int(agreed[2])


def micro_proposal(settings: EngineSettings, ring: Ring | None, stage: Stage | None) -> int:
    """This rank's micro-batches: the rule or the setting on a pipeline ring's rank
    (``micro.resolve_micro_batches``); the setting (0: 1) for a stage given without a ring
    (tests, benchmarks); 1 for a tensor rank and for the whole model on one rank."""
    if ring is not None and ring.sharding != "pipeline":
        return 1
    if ring is not None:
        world = int(ring.group.size())
        return resolve_micro_batches(settings, auto_micro_batches(ring.sharding, world, ring.hosts))
    return resolve_micro_batches(settings, 1) if stage is not None else 1


def disk_tier(loaded: LoadedModel, settings: EngineSettings, bound: int, tensor_rank: int = 0) -> Any:
    """This rank's prompt-cache disk tier (``cache.disk_tier.DiskTier``), or None when the
    settings give it no bytes or no directory, or the RAM prompt cache is off (``bound`` 0:
    a restored block is kept in RAM first)."""
    if settings.prompt_cache_disk_bytes <= 0 or not settings.prompt_cache_dir or bound <= 0:
        return None
    from pathlib import Path

    from worker.engine.cache.disk_tier import DiskTier
    from worker.engine.cache.identity import model_identity, tier_directory

    identity = model_identity(loaded, tensor_rank, settings.kv_cache_bits)
    layers = (loaded.start_layer, loaded.end_layer)
    return DiskTier(tier_directory(Path(settings.prompt_cache_dir), identity, layers),
                    settings.prompt_cache_disk_bytes, identity, layers)


def build_engine(loaded: LoadedModel, settings: EngineSettings = EngineSettings(), *, model_id: str = "",
                 ring: Ring | None = None, stage: Stage | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 on_token: Callable[[TaskId, int], None] | None = None) -> Engine:
    """The engine of ``loaded`` (see the module docstring). ``stage`` replaces the stage the
    builder would make (tests); ``model_id`` names the model in errors (default: its
    directory's name). Raises ``ValueError`` for settings out of range."""
    settings.check()
    model = loaded.model
    transient = prefill_transient_bytes(settings, model)
    capacity, bound = rank_limits(settings, model_kv_bytes_per_token(model, settings.kv_cache_bits), transient)
    micro = micro_proposal(settings, ring, stage)
    gather = None
    if ring is not None:
        if stage is None:
            stage = ring_stage(loaded, ring)
        capacity, bound, micro = agree_limits(ring.all_gather, capacity, bound, micro)
        gather = ring.all_gather
    if micro > 1 and isinstance(getattr(stage, "wait", None), RingWait):
        stage.wait.disable()  # every rank alike, the count is agreed (engine.ring_wait)
    settings = msgspec.structs.replace(settings, micro_batches=micro)
    tensor_rank = int(ring.group.rank()) if ring is not None and ring.sharding == "tensor" else 0
    cache = PromptCache(bound, gather=gather, disk=disk_tier(loaded, settings, bound, tensor_rank),
                        bits=settings.kv_cache_bits)
    return Engine(loaded, settings, stage=stage if stage is not None else LocalStage(),
                  kv_capacity_tokens=capacity, prompt_cache=cache,
                  model_id=model_id, clock=clock, on_token=on_token)
