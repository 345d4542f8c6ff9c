"""The engine of a vision-language model behind the runner's seam (``worker.engine.base.Engine``).

``VisionEngine`` wraps the model's ``TextEngine``: a request without images is a text request
(the same batch, the same prompt cache); a generation with images is first made a vision row
(``worker.vision.rows``: its prompt with the images' tokens, and the KV of its image part made
here, or none when the prompt cache already holds that part for the same images), handed to the
text engine as a ``KvPreset``, then batched, prefilled to its end and decoded with text rows.
On a pipeline instance every rank makes the row at once: the tower on rank 0, hidden states to
the others (``worker.vision.ranks``). A task whose image did not reach this runner (any rank
of it) ends with 503 ``image_unavailable``; a tensor instance, or a model whose language model
has no M-RoPE index (families other than Qwen2-VL's: Gemma 3), does not run the vision tower
yet and answers images with 501 ``vision_not_served`` (docs/models.md#vision-models).
"""

from __future__ import annotations

from typing import Any

from exo_p2p.types import Chunk, ErrorChunk, ErrorInfo, FinishChunk, TaskId, TextGeneration, WorkTask
from exo_p2p.types.observe import EngineStats
from worker.engine.cache.identity import tenant_of
from worker.engine.forward import generation_stream, new_cache
from worker.engine.prefill import KvPreset
from worker.vision.features import FeatureCache
from worker.vision.greedy import vision_inputs
from worker.vision.inbox import RUNNER_IMAGES, missing_error
from worker.vision.ranks import all_ranks_hold, pipeline_image_kv
from worker.vision.rows import image_kv, image_part_end, render_prompt


class VisionEngine:
    """A ``TextEngine`` (``text``) with the vision tower of ``vlm`` and its ``processor`` in
    front (module docstring); ``multi``: the instance has several ranks."""

    def __init__(self, text: Any, vlm: Any, processor: Any, *, multi: bool = False) -> None:
        self.text, self.vlm, self.processor, self.multi = text, vlm, processor, multi
        """``multi``: a pipeline instance (a tensor one has no ``vlm``: images not served)."""
        self.features = FeatureCache()
        config = getattr(vlm, "config", None)
        self.image_token_id = int(getattr(config, "image_token_id", None) or getattr(config, "image_token_index", -1))
        self.served = vlm is not None and hasattr(vlm.language_model, "get_rope_index")  # M-RoPE models (Qwen2-VL)
        self._refused: list[Chunk] = []

    def submit(self, task: WorkTask) -> None:
        if not isinstance(task, TextGeneration) or not any(m.images for m in task.params.messages):
            self.text.submit(task)
            return
        if not self.served:
            why = "of this family (Qwen2-VL's only)" if self.vlm is not None else "split by tensor: place it as a pipeline"
            self._refused.append(ErrorChunk(task_id=task.task_id, error=ErrorInfo(
                501, f"images to a vision model {why} are not served yet", param="messages", code="vision_not_served")))
            return
        try:
            preset = self._row(task)
        except Exception as exc:  # noqa: BLE001 - this request fails, the engine goes on
            preset = ErrorChunk(task_id=task.task_id, error=ErrorInfo(400, f"images could not be read: {exc}"[:500],
                                                                     param="messages", code="invalid_image"))
        if isinstance(preset, ErrorChunk):
            self._refused.append(preset)
            return
        self.text.engine.presets[task.task_id] = preset
        self.text.submit(task)

    def _row(self, task: TextGeneration) -> KvPreset | ErrorChunk:
        """The vision row of ``task`` (module docstring), or the error it ends with. On a
        pipeline every rank makes it at once (``worker.vision.ranks``)."""
        import mlx.core as mx

        engine = self.text.engine
        refs = [r for m in task.params.messages for r in m.images]
        images = [(ref.digest, RUNNER_IMAGES.get(ref.digest)) for ref in refs]
        missing = next((d for d, data in images if data is None), None)
        if not all_ranks_hold(engine.prompt_cache.gather if self.multi else None, missing is None):
            return missing_error(task.task_id, missing or refs[0].digest)
        prompt = render_prompt(task.params, engine.loaded.tokenizer)
        inputs = vision_inputs(self.processor, self.vlm, prompt, images)
        ids = [int(t) for t in inputs.input_ids[0].tolist()]
        end = min(image_part_end(ids, self.image_token_id), len(ids) - 1)
        with mx.stream(generation_stream):
            kv, reused = engine.prompt_cache.reuse(ids, tenant_of(task.params))
            if reused >= end:  # the prompt cache holds the image part of these same images
                return KvPreset(ids, kv, reused, reused)
            model = engine.loaded.model
            if self.multi:
                kv = pipeline_image_kv(engine.stage, model, self.vlm, inputs, end, self.features, new_cache(model))
            else:
                kv = image_kv(self.vlm, inputs, end, self.features, lambda: new_cache(model))
        return KvPreset(ids, kv, end)

    @property
    def warmup_rate(self) -> float:
        """The text engine's decode steps per second at warm-up (the rounds' pace)."""
        return float(self.text.warmup_rate)

    def cancel(self, task_id: TaskId) -> None:
        self.text.engine.presets.pop(task_id, None)
        self.text.cancel(task_id)

    def has_work(self) -> bool:
        return bool(self._refused) or self.text.has_work()

    def must_agree(self) -> bool:
        return self.text.must_agree()

    def hold_proposal(self) -> bool:
        return self.text.hold_proposal()

    def agreed_hold(self, hold: bool) -> None:
        self.text.agreed_hold(hold)

    def step(self) -> list[Chunk]:
        refused, self._refused = self._refused, []
        chunks = refused + (self.text.step() if self.text.has_work() else [])
        for chunk in chunks:
            if isinstance(chunk, FinishChunk | ErrorChunk):
                self.text.engine.presets.pop(chunk.task_id, None)  # a row that ended before it started
        return chunks

    def stats(self) -> EngineStats:
        return self.text.stats()

    def prefixes(self) -> tuple[int, ...] | None:
        return self.text.prefixes()

    def close(self) -> None:
        self.text.close()
