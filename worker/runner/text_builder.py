"""The builder of a text-generation shard (``worker.engine.base.Builder``; docs/architecture.md#vocabulary).

``connect`` joins the MLX ring (multi-rank only, bounded: ``engine.distributed.init_ring``;
test faults may drop the host list, ``worker.runner.faults``); ``load`` loads only this rank's
share (pipeline: its layers; tensor: its 1/world_size of every layer, ``engine.tensor``);
``build`` builds the engine (``worker.engine.builder``: a collective on a multi-rank instance,
its stage and limits agreed) and warms it up: a few greedy tokens, discarded, so the first
request does not pay first-use costs (a model without a chat template is warmed up all the
same: its error chunk is discarded).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from exo_p2p.types import FinishChunk
from exo_p2p.types.tasks import ChatMessage, GenerationParams
from worker.engine.base import Gather
from worker.engine.text import TextEngine
from worker.runner.faults import STAGE_LOADING, STAGE_WARMUP, RunnerFaults
from worker.runner.protocol import RunnerSetup

WARMUP_STEPS = 1000
"""Engine steps the warm-up may take at most (it asks for 6 tokens)."""


class TextBuilder:
    """Connect, load and build the ``TextEngine`` of ``setup``'s shard (module docstring)."""

    def __init__(self, setup: RunnerSetup, faults: RunnerFaults) -> None:
        self.setup, self.faults = setup, faults
        self.multi = setup.shard.world_size > 1
        self.group: Any = None
        self.loaded: Any = None
        self.all_gather: Gather | None = None

    @property
    def connected(self) -> bool:
        return self.group is not None

    def connect(self, on_timeout: Callable[[str], tuple[int, bytes]]) -> None:
        from worker.engine.distributed import init_ring

        shard, instance = self.setup.shard, self.setup.instance
        if instance.sharding not in ("pipeline", "tensor"):
            raise RuntimeError(f"{instance.sharding} sharding is not supported by this runner")
        addresses = self.faults.ring_addresses([s.ring_address for s in instance.shards])
        self.group = init_ring(addresses, shard.rank, shard.world_size, timeout_report=on_timeout)

    def load(self) -> Iterator[tuple[int, int]]:
        import mlx.core as mx

        from worker.engine.loading.loader import LoadProgress, load_model

        shard = self.setup.shard
        self.faults.at(STAGE_LOADING)
        tensor_group = self.group if self.multi and self.setup.instance.sharding == "tensor" else None
        for item in load_model(self.setup.model_dir, start_layer=shard.start_layer, end_layer=shard.end_layer,
                               tensor_group=tensor_group, weights_dtype=shard.weights_dtype):
            if isinstance(item, LoadProgress):
                yield item.layers_loaded, item.layers_total
            else:
                self.loaded = item
        if self.loaded is None:
            raise RuntimeError(f"loading {self.setup.model_dir} gave no model")
        mx.synchronize()

    def peak_memory_bytes(self) -> int:
        return int(getattr(self.loaded, "peak_memory_bytes", 0))

    def build(self, on_step: Callable[[float], None]) -> TextEngine:
        from worker.engine.batch_memory import model_kv_bytes_per_token
        from worker.engine.builder import build_engine

        if self.loaded is None:
            raise RuntimeError("build before load")
        self.faults.at(STAGE_WARMUP)
        ring = self._ring() if self.multi else None
        engine = build_engine(self.loaded, self.setup.engine, model_id=self.setup.instance.model_id, ring=ring)
        if ring is not None and not ring.wait.active:  # ranks that compute at once, or spin as they wait
            from worker.runner.blas_threads import share_blas_threads

            shared = share_blas_threads([s.ring_address for s in self.setup.instance.shards], self.setup.shard.rank)
            if shared is not None:
                print(f"runner: {shared} BLAS thread(s): ranks of this instance share this host", file=sys.stderr, flush=True)
        engine.submit("warmup", GenerationParams(messages=(ChatMessage("user", "Hi"),), max_tokens=6, temperature=0.0))
        rate = 0.0
        for _ in range(WARMUP_STEPS):
            if not engine.has_work():
                break
            started = time.monotonic()
            for chunk in engine.step():
                if isinstance(chunk, FinishChunk):
                    rate = chunk.decode_tokens_per_second
            on_step(time.monotonic() - started)
        text = TextEngine(engine, agreed=self.multi, kv_bytes_per_token=model_kv_bytes_per_token(self.loaded.model, self.setup.engine.kv_cache_bits),
                          warmup_rate=rate, embed=self._embed_work(engine.stage))
        text.forget_warmup()
        return text

    def _embed_work(self, stage: Any) -> Any:
        """The pooling branch of the model, whole or this rank's share over ``stage``
        (``worker.embed``), else None (a model whose pooling files are unreadable does not
        embed, said on stderr, the same on every rank)."""
        from worker.embed.build import decoder_embedder
        from worker.embed.work import EmbedWork

        try:
            return EmbedWork(decoder_embedder(self.loaded, stage))
        except ValueError as exc:
            print(f"runner: this model cannot embed: {exc}", file=sys.stderr, flush=True)
            return None

    def _ring(self) -> Any:
        """This rank's ``Ring``; its all-gather is also the rounds'. A pipeline rank waits
        for its neighbours asleep (``engine.ring_wait``) and keeps the node's BLAS threads;
        any other rank (tensor, micro-batches, or ring sockets not found) takes its share of
        them once the engine is built (``blas_threads``)."""
        from worker.engine.builder import Ring
        from worker.engine.distributed import ring_all_gather
        from worker.engine.forward import generation_stream
        from worker.engine.ring_wait import pipeline_wait

        instance = self.setup.instance
        # one dtype between ranks: float32 when any rank holds float32 weights, else what the
        # stored weights compute in
        float32 = any(s.weights_dtype == "float32" for s in instance.shards)
        wait = pipeline_wait(instance, self.setup.shard.rank)
        self.all_gather = ring_all_gather(self.group, generation_stream, wait)
        hosts = len({s.ring_address.rpartition(":")[0] for s in instance.shards})
        return Ring(self.group, instance.sharding, float32, self.all_gather, hosts=hosts, wait=wait)
