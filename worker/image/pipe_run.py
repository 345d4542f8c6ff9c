"""The runs of one image on the ranks of a pipeline (docs/images.md#pipeline): the leader's
(rank 0: mflux's run, ``worker.image.denoise.ImageRun``, whose transformer call goes over the
ring) and the others' (their blocks only). Both have the faces ``worker.image.work`` steps:
``step()``, ``finished``, ``done_steps``, ``steps``, ``emits`` (rank 0 alone makes pictures).
The collectives of ``worker.image.ranks`` run at the same steps on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx

from worker.image.ranks import DTYPES, HEADER, RankPipeline


class ImageRequestError(ValueError):
    """The leader could not begin the image: the task ends with this error on every rank."""


class LeaderRun:
    """Rank 0's run: ``make()`` builds mflux's run (prompt encoding, latents, scheduler); a
    failure there is kept and told to the other ranks at the first step."""

    emits = True

    def __init__(self, pipe: RankPipeline, make: Callable[[], Any], steps: int) -> None:
        self.pipe, self.steps = pipe, steps
        self.run: Any = None
        self.error: Exception | None = None
        try:
            self.run = make()
        except Exception as exc:  # noqa: BLE001 - told to every rank, then the task's error
            self.error = exc
        self._ids: mx.array | None = None
        self._header: list[int] = []

    @property
    def done_steps(self) -> int:
        return 0 if self.run is None else self.run.done_steps

    @property
    def finished(self) -> bool:
        return self.run is not None and self.run.finished

    def _begin(self) -> None:
        if self.run is None:
            self.pipe.exchange([0] * HEADER, None, None)
            raise ImageRequestError(f"the image could not begin: {self.error}")
        r, inputs = self.run, self.run._inputs
        text = inputs["text_ids"].shape[1]
        parts = [inputs["text_ids"][0], r.latent_ids[0]]
        hidden = r.latents
        if "image_latents" in inputs:
            parts.append(inputs["image_latent_ids"][0])
            hidden = mx.concatenate([r.latents, inputs["image_latents"]], axis=1)
        ids = mx.concatenate(parts, axis=0).astype(mx.int32)
        sched = r.config.scheduler
        times = mx.array([sched.timesteps[t] for t in range(r.config.init_time_step, r.steps)]).astype(mx.float32)
        code = self.pipe.state_dtype(hidden, inputs["prompt_embeds"], ids, text, sched.timesteps[r.config.init_time_step])
        header = [1, text, hidden.shape[1], r.latents.shape[1], ids.shape[1], code, DTYPES.index(hidden.dtype),
                  times.shape[0]]
        self._header, self._ids, _ = self.pipe.exchange(header, ids, times)
        r._predict = self._predict

    def _predict(self, *, latents: mx.array, prompt_embeds: mx.array, timestep: Any,
                 image_latents: mx.array | None = None, **_: Any) -> mx.array:
        hidden = latents if image_latents is None else mx.concatenate([latents, image_latents], axis=1)
        assert self._ids is not None
        return self.pipe.noise(self._ids, self._header, timestep, (hidden, prompt_embeds))

    def step(self) -> None:
        """One denoising step over the ring (the first one tells the others the image)."""
        if self._ids is None:
            self._begin()
        self.run.step()

    def settle(self) -> None:
        """After the final image: meet the other ranks (``RankPipeline.barrier``)."""
        self.pipe.barrier()

    def preview(self) -> Any:
        return self.run.preview()

    def image(self) -> Any:
        return self.run.image()


class FollowerRun:
    """A rank > 0's run: its blocks at each step, with what the leader told it."""

    emits = False

    def __init__(self, pipe: RankPipeline, steps: int) -> None:
        self.pipe, self.steps, self.done_steps = pipe, steps, 0
        self._ids: mx.array | None = None
        self._header: list[int] = []
        self._times: Any = None

    @property
    def finished(self) -> bool:
        return self._times is not None and self.done_steps >= self._times.shape[0]

    def step(self) -> None:
        """One denoising step: this rank's blocks (the first step also hears the image)."""
        if self._ids is None:
            self._header, self._ids, self._times = self.pipe.exchange(None, None, None)
            if self._ids is None:
                raise ImageRequestError("the image could not begin on the pipeline's first rank")
        self.pipe.noise(self._ids, self._header, self._times[self.done_steps], None)
        self.done_steps += 1

    def settle(self) -> None:
        """After the last step: wait for the leader's final image (``RankPipeline.barrier``)."""
        self.pipe.barrier()
