"""The runner's lifecycle tasks: join the ring, load the shard, warm up (docs/architecture.md#vocabulary).

``ConnectToGroup`` → ``connect`` (multi-rank only: the MLX ring, bounded), ``LoadModel`` →
``load`` (only this rank's share: pipeline, its layers; tensor, its 1/world_size of every
layer, ``engine.tensor``), ``StartWarmup`` → ``warmup`` (the engine built, a few discarded
tokens generated in lockstep on every rank, and the ranks' pace agreed). Each reports the
runner's status as it goes; an exception fails the runner (``RunnerProcess.handle_item``).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

import numpy as np

from exo_p2p.types import (
    FinishChunk,
    RunnerConnected,
    RunnerConnecting,
    RunnerFailed,
    RunnerLoaded,
    RunnerLoading,
    RunnerReady,
    RunnerWarmingUp,
)
from worker.runner.faults import STAGE_LOADING, STAGE_WARMUP, RunnerFaults
from worker.runner.pace import check_every_for, round_seconds
from worker.runner.protocol import StatusMsg, frame

if TYPE_CHECKING:
    from worker.engine.builder import Ring
    from worker.runner.main import RunnerProcess


def connect(runner: RunnerProcess, faults: RunnerFaults) -> None:
    """Join the instance's ring (bounded; see ``engine.distributed.init_ring``); test
    faults may drop the host list (``worker.runner.faults``)."""
    from worker.engine.distributed import init_ring

    assert runner.setup is not None
    shard, instance = runner.setup.shard, runner.setup.instance
    if instance.sharding not in ("pipeline", "tensor"):
        raise RuntimeError(f"{instance.sharding} sharding is not supported by this runner")
    runner.set_status(RunnerConnecting())
    addresses = faults.ring_addresses([s.ring_address for s in instance.shards])
    runner.group = init_ring(
        addresses, shard.rank, shard.world_size,
        timeout_report=lambda m: (runner.out_fd, frame(StatusMsg(RunnerFailed(m)))),
    )
    runner.set_status(RunnerConnected())


def load(runner: RunnerProcess, faults: RunnerFaults) -> None:
    """Load this rank's layers, reporting ``RunnerLoading`` from the start (the imports of
    MLX and mlx-lm below take seconds on a busy machine: that is loading too)."""
    assert runner.setup is not None
    shard = runner.setup.shard
    total = shard.end_layer - shard.start_layer
    runner.set_status(RunnerLoading(0, total))
    import mlx.core as mx

    from worker.engine.loader import LoadProgress, load_model

    faults.at(STAGE_LOADING)
    loaded = None
    tensor_group = runner.group if runner.multi and runner.setup.instance.sharding == "tensor" else None
    for item in load_model(runner.setup.model_dir, start_layer=shard.start_layer, end_layer=shard.end_layer,
                           tensor_group=tensor_group, weights_dtype=shard.weights_dtype):
        if isinstance(item, LoadProgress):
            runner.pulse.progress()
            runner.set_status(RunnerLoading(item.layers_loaded, item.layers_total))
        else:
            loaded = item
    assert loaded is not None
    runner.loaded = loaded
    mx.synchronize()
    runner.set_status(RunnerLoaded(peak_memory_bytes=int(getattr(loaded, "peak_memory_bytes", 0))))


def warmup(runner: RunnerProcess, faults: RunnerFaults) -> None:
    """Report WarmingUp; build the engine (a collective on a multi-rank instance: its stage
    and limits are agreed, ``worker.engine.builder``); generate a few tokens (greedy,
    discarded) so the first request does not pay for first-use costs, bounded by its
    ``max_tokens`` (a model without a chat template is warmed up all the same: the error chunk
    is discarded); on a multi-rank instance agree the pace (``check_every``); report Ready."""
    from exo_p2p.types.tasks import ChatMessage, GenerationParams
    from worker.engine.batch_memory import model_kv_bytes_per_token
    from worker.engine.builder import build_engine

    assert runner.setup is not None and runner.loaded is not None
    runner.set_status(RunnerWarmingUp())
    faults.at(STAGE_WARMUP)
    ring = make_ring(runner) if runner.multi else None
    runner.engine = build_engine(runner.loaded, runner.setup.engine, model_id=runner.setup.instance.model_id, ring=ring)
    if ring is not None and not ring.wait.active:  # ranks that compute at once, or spin as they wait
        from worker.runner.blas_threads import share_blas_threads

        shared = share_blas_threads([s.ring_address for s in runner.setup.instance.shards], runner.setup.shard.rank)
        if shared is not None:
            print(f"runner: {shared} BLAS thread(s): ranks of this instance share this host", file=sys.stderr, flush=True)
    runner.engine.submit("warmup", GenerationParams(messages=(ChatMessage("user", "Hi"),), max_tokens=6, temperature=0.0))
    tps = 0.0
    for _ in range(1000):
        if not runner.engine.has_work():
            break
        started = time.monotonic()
        for chunk in runner.engine.step():
            if isinstance(chunk, FinishChunk):
                tps = chunk.decode_tokens_per_second
        runner.pulse.record(time.monotonic() - started, warmup=True)  # the stuck bound's history
        runner.pulse.progress()
    runner.kv_bytes_per_token = model_kv_bytes_per_token(runner.loaded.model)
    cache = runner.engine.prompt_cache  # the warm-up request is not traffic
    cache.hits = cache.misses = cache.reused_tokens = runner.engine.prefilled_tokens = 0
    runner.note_stats(force=True)
    if runner.multi:  # the pace is the same on every rank: the slowest rank's
        assert runner.all_gather is not None
        proposal = np.array([check_every_for(tps, round_seconds(runner.setup.engine.max_batch))], dtype=np.int64)
        runner.check_every = int(runner.all_gather(proposal).min())
    runner.set_status(RunnerReady())


def make_ring(runner: RunnerProcess) -> Ring:
    """This rank's ``Ring`` (its all-gather is also the agreement's), and the
    ``TaskAgreement`` that holds tasks from now on. A pipeline rank waits for its
    neighbours asleep (``engine.ring_wait``) and keeps the node's BLAS threads; any other
    rank (tensor, micro-batches, or ring sockets not found) takes its share of them once
    the engine is built (``warmup``, ``blas_threads``)."""
    from worker.engine.agreement import TaskAgreement
    from worker.engine.builder import Ring
    from worker.engine.distributed import ring_all_gather
    from worker.engine.forward import generation_stream
    from worker.engine.ring_wait import pipeline_wait

    assert runner.group is not None and runner.setup is not None
    # one dtype between ranks: float32 when any rank holds float32 weights, else what the
    # stored weights compute in
    float32 = any(s.weights_dtype == "float32" for s in runner.setup.instance.shards)
    wait = pipeline_wait(runner.setup.instance, runner.setup.shard.rank)
    runner.all_gather = ring_all_gather(runner.group, generation_stream, wait)
    runner.agreement = TaskAgreement()
    hosts = len({s.ring_address.rpartition(":")[0] for s in runner.setup.instance.shards})
    return Ring(runner.group, runner.setup.instance.sharding, float32, runner.all_gather, hosts=hosts, wait=wait)
