"""One FLUX.2-klein image, a denoising step at a time (docs/images.md#steps).

``ImageRun`` does what mflux's ``Flux2Klein.generate_image`` does for a text-to-image request
(the same prompt encoding, seeded latents, scheduler, compiled transformer call and VAE
decode, in the same order, so its pixels equal mflux's for the same checkpoint, seed and size),
split so the runner's engine can step it: ``step()`` runs one denoising step, ``preview()``
decodes the latents so far (a partial image) and ``image()`` decodes the final one. Guidance is
1.0 (the distilled klein models' default; no negative prompt pass).

With a ``reference`` image (an edit) it does what mflux's ``Flux2KleinEdit.generate_image``
does instead: the reference encoded by the VAE and its tokens joined to the latents at every
step (mflux's reference conditioning; ``worker.image.load.edit_view`` shares the weights).
"""

from __future__ import annotations

from typing import Any

GUIDANCE = 1.0
"""The guidance scale every run uses (mflux's klein default; > 1 would add a negative pass)."""


class ImageRun:
    """A run of ``pipeline`` (``worker.image.load.load_pipeline``'s; with ``reference``, a path
    to the image to edit, its ``edit_view``): ``prompt`` (str), ``seed`` (int), ``steps``
    (≥ 1), ``width`` × ``height`` (pixels, multiples of 16). Encodes the prompt (and the
    reference) and makes the seeded latents when made (its cost is the first step's)."""

    def __init__(self, pipeline: Any, *, prompt: str, seed: int, steps: int, width: int, height: int,
                 reference: str | None = None) -> None:
        from mflux.models.common.config.config import Config
        from mflux.models.flux2.latent_creator.flux2_latent_creator import Flux2LatentCreator

        self.pipeline, self.seed, self.prompt = pipeline, seed, prompt
        self.config = Config(model_config=pipeline.model_config, num_inference_steps=steps, height=height,
                             width=width, guidance=GUIDANCE, image_path=reference, image_strength=None,
                             scheduler="flow_match_euler_discrete")
        from worker.image.prompts import prompt_pair

        embeds, text_ids, neg, neg_ids = prompt_pair(pipeline, prompt, GUIDANCE)  # kept for the next image of it
        self._inputs = {"prompt_embeds": embeds, "text_ids": text_ids, "negative_prompt_embeds": neg,
                        "negative_text_ids": neg_ids, "guidance": GUIDANCE}
        if reference is None:
            self.latents, self.latent_ids, self.lat_h, self.lat_w = pipeline._prepare_generation_latents(
                seed=seed, config=self.config)
        else:
            from mflux.models.flux2.variants.edit.flux2_klein_edit_helpers import _Flux2KleinEditHelpers as Edit

            self.latents, self.latent_ids, self.lat_h, self.lat_w = Flux2LatentCreator.prepare_packed_latents(
                seed=seed, height=height, width=width, batch_size=1)
            image_latents, image_ids = Edit.prepare_reference_image_conditioning(
                vae=pipeline.vae, tiling_config=pipeline.tiling_config, image_paths=[reference], batch_size=1)
            self._inputs.update(image_latents=image_latents, image_latent_ids=image_ids)
        self._predict = pipeline._predict(pipeline.transformer)
        self._t = self.config.init_time_step
        self.steps = steps

    @property
    def done_steps(self) -> int:
        """Denoising steps done so far."""
        return self._t - self.config.init_time_step

    @property
    def finished(self) -> bool:
        """Every denoising step is done (``image()`` is next)."""
        return self._t >= self.steps

    def step(self) -> None:
        """One denoising step (evaluated). Raises ``RuntimeError`` past the last."""
        import mlx.core as mx

        if self.finished:
            raise RuntimeError("the image has no denoising step left")
        scheduler, t = self.config.scheduler, self._t
        noise = self._predict(latents=self.latents, latent_ids=self.latent_ids,
                              timestep=scheduler.timesteps[t], **self._inputs)
        self.latents = scheduler.step(noise=noise, timestep=t, latents=self.latents, sigmas=scheduler.sigmas)
        mx.eval(self.latents)
        self._t += 1

    def _decode(self) -> Any:
        from mflux.utils.image_util import ImageUtil

        lat = self.latents
        packed = lat.reshape(lat.shape[0], self.lat_h, self.lat_w, lat.shape[-1]).transpose(0, 3, 1, 2)
        decoded = self.pipeline.vae.decode_packed_latents(packed, tiling_config=self.pipeline.tiling_config)
        return ImageUtil.to_pil(decoded)

    def preview(self) -> Any:
        """A PIL image of the latents so far (a partial image: noisy until the last step)."""
        return self._decode()

    def image(self) -> Any:
        """The final PIL image (RGB). Raises ``RuntimeError`` before the last step."""
        if not self.finished:
            raise RuntimeError(f"the image is at step {self.done_steps} of {self.steps}")
        return self._decode()
