"""The engine and builder of an image model behind the runner's seam (``worker.engine.base``;
docs/architecture.md#how-to-add-a-kind-of-work, docs/images.md).

One rank holds the whole pipeline, or the transformer's blocks are split over a pipeline of
ranks on the MLX ring (``worker.image.pipe_run``, docs/images.md#pipeline): then the runner's
agreement rounds (``worker.runner.rounds``) start and cancel tasks on every rank alike, and
the engine asks for a round before every step while it has work (``must_agree``), so a cancel
stops every rank within one denoising step. A step is one denoising step of the running image
(``worker.image.work``), so cancellation and the runner's liveness work at that grain; an edit
runs mflux's edit path over the same weights (``worker.image.load.edit_view``); text tasks get
a 400 ``ErrorChunk``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from exo_p2p.types import ImageEdits, ImageGeneration, NodeId, TaskId, WorkTask
from exo_p2p.types.images import ImageParams
from exo_p2p.types.observe import EngineStats
from worker.engine.base import OneRankFaces
from worker.image.work import ImageWork
from worker.runner.faults import STAGE_LOADING, STAGE_WARMUP, RunnerFaults
from worker.runner.protocol import RunnerSetup

WARMUP = {"prompt": "warm-up", "seed": 0, "steps": 1, "width": 64, "height": 64}
"""The warm-up image (discarded): compiles the transformer call so the first request pays no first-use cost."""


class ImageEngine(OneRankFaces):
    """The ``Engine`` of an image model (module docstring); ``make_run(task)`` makes a task's run."""

    does = "makes images"

    def __init__(self, make_run: Callable[[ImageGeneration], Any], agreed: bool = False) -> None:
        super().__init__(ImageWork(make_run))
        self.agreed = agreed

    def must_agree(self) -> bool:
        """A pipeline's ranks agree before every step while there is work (a denoising step
        takes far longer than a round's all-gather of one small row)."""
        return self.agreed and bool(self.work.has_work())

    def takes(self, task: WorkTask) -> bool:
        return isinstance(task, ImageGeneration)  # and ImageEdits

    def stats(self) -> EngineStats:
        return EngineStats(queued=self.work.queued, batch_rows=int(self.work.running() is not None))


def run_maker(pipeline: Any, pipe: Any = None) -> Callable[[ImageGeneration], Any]:
    """``task -> run`` of ``pipeline``: an ``ImageRun`` (``worker.image.denoise``) on one rank;
    on a pipeline (``pipe``, this rank's ``worker.image.ranks.RankPipeline``) the leader's or a
    follower's run (``worker.image.pipe_run``). An edit's reference bytes go through a
    temporary file (mflux reads references from paths), removed once the run has encoded
    it. Raises ``ValueError`` for an edit without an image."""
    from worker.image.denoise import ImageRun
    from worker.image.load import edit_view
    from worker.image.pipe_run import FollowerRun, LeaderRun

    editor: list[Any] = []

    def whole(size: dict[str, Any], image: bytes | None) -> Any:
        if image is None:
            return ImageRun(pipeline, **size)
        editor[:] = editor or [edit_view(pipeline)]
        with tempfile.NamedTemporaryFile(prefix="exo-p2p-edit-", suffix=".img") as f:
            f.write(image)
            f.flush()
            return ImageRun(editor[0], reference=f.name, **size)

    def make(task: ImageGeneration) -> Any:
        p = task.params
        size = {"prompt": p.prompt, "seed": p.seed, "steps": p.steps, "width": p.width, "height": p.height}
        if isinstance(task, ImageEdits) and not p.image:
            raise ValueError("an edit needs its image")
        image = p.image if isinstance(task, ImageEdits) else None
        if pipe is None:
            return whole(size, image)
        if pipe.rank > 0:
            return FollowerRun(pipe, p.steps)
        return LeaderRun(pipe, lambda: whole(size, image), p.steps)

    return make


class ImageBuilder:
    """Load an image pipeline with mflux (``worker.image.load``) and build its ``ImageEngine``:
    one rank, or this rank's share of a pipeline over the ring."""

    def __init__(self, setup: RunnerSetup, faults: RunnerFaults) -> None:
        self.setup, self.faults = setup, faults
        self.pipeline: Any = None
        self.group: Any = None
        self.all_gather: Any = None
        self.multi = setup.shard.world_size > 1

    @property
    def connected(self) -> bool:
        return self.group is not None

    def connect(self, on_timeout: Callable[[str], tuple[int, bytes]]) -> None:
        from worker.engine.distributed import init_ring

        shard, instance = self.setup.shard, self.setup.instance
        if instance.sharding != "pipeline":
            raise RuntimeError(f"an image model's blocks split as a pipeline only, not {instance.sharding}")
        addresses = self.faults.ring_addresses([s.ring_address for s in instance.shards])
        self.group = init_ring(addresses, shard.rank, shard.world_size, timeout_report=on_timeout)

    def load(self) -> Iterator[tuple[int, int]]:
        from worker.image.load import LOAD_PHASES, load_progress
        from worker.runner.startup import preload

        self.faults.at(STAGE_LOADING)
        yield 0, LOAD_PHASES
        # the runner's background preload imports transformers (worker.runner.startup); mflux's
        # imports of its lazy names raced it (ImportError), so wait for those imports first
        preload()
        out: list[Any] = []
        shard = self.setup.shard
        span = (shard.start_layer, shard.end_layer) if self.multi else None
        yield from load_progress(self.setup.model_dir, out, span=span, leader=shard.rank == 0)
        self.pipeline = out[0]

    def peak_memory_bytes(self) -> int:
        import mlx.core as mx

        return int(mx.get_peak_memory())

    def build(self, on_step: Callable[[float], None]) -> ImageEngine:
        if self.pipeline is None:
            raise RuntimeError("build before load")
        self.faults.at(STAGE_WARMUP)
        pipe = None
        if self.multi:
            pipe = self._pipe()
        make = run_maker(self.pipeline, pipe)
        inst = self.setup.instance
        run = make(ImageGeneration(task_id=TaskId("warmup"), instance_id=inst.instance_id, model_id=inst.model_id,
                                   params=ImageParams(**WARMUP), api_node_id=NodeId("")))
        while not run.finished:  # a collective on a pipeline: every rank warms up alike
            started = time.monotonic()
            run.step()
            on_step(time.monotonic() - started)
        if getattr(run, "emits", True):
            run.image()
        return ImageEngine(make, agreed=self.multi)

    def _pipe(self) -> Any:
        """This rank's ``RankPipeline``; the ring's all-gather is also the rounds'."""
        from worker.engine.distributed import ring_all_gather
        from worker.engine.ring_wait import pipeline_wait
        from worker.image.ranks import RankPipeline
        from worker.image.stages import Stage

        shard = self.setup.shard
        wait = pipeline_wait(self.setup.instance, shard.rank)
        self.all_gather = ring_all_gather(self.group, None, wait)
        return RankPipeline(Stage(self.pipeline.transformer, shard.start_layer, shard.end_layer), self.group, wait)
