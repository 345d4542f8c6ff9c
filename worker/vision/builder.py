"""The builder of a vision-language model's runner (``worker.engine.base.Builder``;
docs/architecture.md#how-to-add-a-kind-of-work).

A ``TextBuilder`` (the language model through the text loader: its layers, tensor or pipeline
share, the text engine and its warm-up), then on rank 0 of a one-rank instance the model as
mlx-vlm loads it (vision tower, processor) whose language model is pointed at the text
engine's arrays (``share_language_model``: one copy of the weights), and a ``VisionEngine`` in
front of the text engine. A multi-rank instance serves text and answers images with 501 for
now (``worker.vision.engine``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from worker.runner.text_builder import TextBuilder
from worker.vision.engine import VisionEngine


def share_language_model(vlm: Any, text_model: Any) -> None:
    """Point ``vlm.language_model``'s parameters at ``text_model.language_model``'s (same
    names in mlx-vlm and mlx-lm). Raises ``ValueError`` when their names differ."""
    from mlx.utils import tree_flatten

    ours = dict(tree_flatten(text_model.language_model.parameters()))
    theirs = {name for name, _ in tree_flatten(vlm.language_model.parameters())}
    if set(ours) != theirs:
        missing = sorted(theirs.symmetric_difference(ours))[:4]
        raise ValueError(f"the language model's weights differ between the text and vision loaders: {missing}")
    vlm.language_model.load_weights(list(ours.items()), strict=True)


class VisionBuilder(TextBuilder):
    """Connect, load and build a vision-language model's runner (module docstring)."""

    def __init__(self, setup: Any, faults: Any) -> None:
        super().__init__(setup, faults)
        self.vlm: Any = None
        self.processor: Any = None

    def load(self) -> Iterator[tuple[int, int]]:
        yield from super().load()
        if self.multi and self.setup.instance.sharding != "pipeline":
            return  # tensor: images not served yet
        import mlx.core as mx
        from mlx_vlm.utils import load as load_vlm

        self.vlm, self.processor = load_vlm(self.setup.model_dir, lazy=True)
        if not self.multi:
            share_language_model(self.vlm, self.loaded.model)
            mx.eval(self.vlm.parameters())
        # a pipeline rank reads only what it uses of the lazy model: rank 0 the tower and the
        # embedding, every rank the processor and the M-RoPE (worker.vision.ranks)

    def build(self, on_step: Callable[[float], None]) -> Any:
        return VisionEngine(super().build(on_step), self.vlm, self.processor, multi=self.multi)
