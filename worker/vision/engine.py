"""The engine of a vision-language model behind the runner's seam (``worker.engine.base.Engine``).

``VisionEngine`` wraps the model's ``TextEngine``: a request without images is a text request
(the same batch, the same prompt cache); a generation with images is first made a vision row
(``worker.vision.rows``: its prompt with the images' tokens, and the KV of its image part made
here, or none when the prompt cache already holds that part for the same images), handed to the
text engine as a ``KvPreset``, then batched, prefilled to its end and decoded with text rows.
A task whose image did not reach this runner ends with 503 ``image_unavailable``; a
multi-rank instance, or a model whose language model has no M-RoPE index (families other than
Qwen2-VL's: Gemma 3), does not run the vision tower yet and answers images with 501
``vision_not_served`` (docs/models.md#vision-models).
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
from worker.vision.rows import image_kv, image_part_end, render_prompt


class VisionEngine:
    """A ``TextEngine`` (``text``) with the vision tower of ``vlm`` and its ``processor`` in
    front (module docstring); ``multi``: the instance has several ranks."""

    def __init__(self, text: Any, vlm: Any, processor: Any, *, multi: bool = False) -> None:
        self.text, self.vlm, self.processor, self.multi = text, vlm, processor, multi
        self.features = FeatureCache()
        config = getattr(vlm, "config", None)
        self.image_token_id = int(getattr(config, "image_token_id", None) or getattr(config, "image_token_index", -1))
        self.served = vlm is not None and hasattr(vlm.language_model, "get_rope_index")  # M-RoPE models (Qwen2-VL)
        self._refused: list[Chunk] = []

    def submit(self, task: WorkTask) -> None:
        if not isinstance(task, TextGeneration) or not any(m.images for m in task.params.messages):
            self.text.submit(task)
            return
        if self.multi or not self.served:
            why = "split over several nodes: place it on one node" if self.multi else "of this family (Qwen2-VL's only)"
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
        """The vision row of ``task`` (module docstring), or the error it ends with."""
        import mlx.core as mx

        images = []
        for ref in (r for m in task.params.messages for r in m.images):
            data = RUNNER_IMAGES.get(ref.digest)
            if data is None:
                return missing_error(task.task_id, ref.digest)
            images.append((ref.digest, data))
        engine = self.text.engine
        prompt = render_prompt(task.params, engine.loaded.tokenizer)
        inputs = vision_inputs(self.processor, self.vlm, prompt, images)
        ids = [int(t) for t in inputs.input_ids[0].tolist()]
        end = min(image_part_end(ids, self.image_token_id), len(ids) - 1)
        with mx.stream(generation_stream):
            kv, reused = engine.prompt_cache.reuse(ids, tenant_of(task.params))
            if reused >= end:  # the prompt cache holds the image part of these same images
                return KvPreset(ids, kv, reused, reused)
            kv = image_kv(self.vlm, inputs, end, self.features, lambda: new_cache(engine.loaded.model))
        return KvPreset(ids, kv, end)

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
