"""The engine and builder of an image model behind the runner's seam (``worker.engine.base``;
docs/architecture.md#how-to-add-a-kind-of-work, docs/images.md).

One rank holds the whole pipeline (placement keeps an image model on one node:
``master.task_kinds.split_refusal``), so ``ImageBuilder.connect`` refuses a ring and the engine
never needs an agreement round. A step is one denoising step of the running image
(``worker.image.work``), so cancellation and the runner's liveness work at that grain; an edit
runs mflux's edit path over the same weights (``worker.image.load.edit_view``); text tasks get
a 400 ``ErrorChunk``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from exo_p2p.types import ImageEdits, ImageGeneration, WorkTask
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

    def __init__(self, make_run: Callable[[ImageGeneration], Any]) -> None:
        super().__init__(ImageWork(make_run))

    def takes(self, task: WorkTask) -> bool:
        return isinstance(task, ImageGeneration)  # and ImageEdits

    def stats(self) -> EngineStats:
        return EngineStats(queued=self.work.queued, batch_rows=int(self.work.running() is not None))


def run_maker(pipeline: Any) -> Callable[[ImageGeneration], Any]:
    """``task -> ImageRun`` of ``pipeline`` (``worker.image.denoise``); an edit's reference
    bytes go through a temporary file (mflux reads references from paths), removed once the
    run has encoded it. Raises ``ValueError`` for an edit without an image."""
    import tempfile

    from worker.image.denoise import ImageRun
    from worker.image.load import edit_view

    editor: list[Any] = []

    def make(task: ImageGeneration) -> Any:
        p = task.params
        size = {"prompt": p.prompt, "seed": p.seed, "steps": p.steps, "width": p.width, "height": p.height}
        if not isinstance(task, ImageEdits):
            return ImageRun(pipeline, **size)
        if not p.image:
            raise ValueError("an edit needs its image")
        editor[:] = editor or [edit_view(pipeline)]
        with tempfile.NamedTemporaryFile(prefix="exo-p2p-edit-", suffix=".img") as f:
            f.write(p.image)
            f.flush()
            return ImageRun(editor[0], reference=f.name, **size)

    return make


class ImageBuilder:
    """Load an image pipeline with mflux (``worker.image.load``) and build its ``ImageEngine`` (one rank)."""

    all_gather = None
    connected = False

    def __init__(self, setup: RunnerSetup, faults: RunnerFaults) -> None:
        self.setup, self.faults = setup, faults
        self.pipeline: Any = None

    def connect(self, on_timeout: Callable[[str], tuple[int, bytes]]) -> None:
        raise RuntimeError("an image model runs whole on one node here; it is never split into ranks")

    def load(self) -> Iterator[tuple[int, int]]:
        from worker.image.load import LOAD_PHASES, load_progress
        from worker.runner.startup import preload

        self.faults.at(STAGE_LOADING)
        yield 0, LOAD_PHASES
        # the runner's background preload imports transformers (worker.runner.startup); mflux's
        # imports of its lazy names raced it (ImportError), so wait for those imports first
        preload()
        out: list[Any] = []
        yield from load_progress(self.setup.model_dir, out)
        self.pipeline = out[0]

    def peak_memory_bytes(self) -> int:
        import mlx.core as mx

        return int(mx.get_peak_memory())

    def build(self, on_step: Callable[[float], None]) -> ImageEngine:
        from worker.image.denoise import ImageRun

        if self.pipeline is None:
            raise RuntimeError("build before load")
        self.faults.at(STAGE_WARMUP)
        run = ImageRun(self.pipeline, **WARMUP)
        while not run.finished:
            started = time.monotonic()
            run.step()
            on_step(time.monotonic() - started)
        run.image()
        return ImageEngine(run_maker(self.pipeline))
