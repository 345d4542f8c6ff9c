"""Which builder a runner uses: one per kind of model (docs/architecture.md#how-to-add-a-kind-of-work).

``choose_builder`` reads the model's kind from its files (``exo_p2p.types.kinds.model_kind``:
its ``config.json`` and file names) and returns that kind's ``Builder``
(``worker.engine.base``). A new kind of model adds one entry to ``BUILDERS``.

Builders are named, not imported, here: a builder's module imports its engine and MLX (seconds
of CPU on a busy machine), which must not delay the runner's start (its heartbeat, its first
status); the runner's preload imports them in the background (``worker.runner.startup``).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from exo_p2p.types.kinds import ModelKind, model_kind
from worker.engine.base import Builder
from worker.runner.faults import RunnerFaults
from worker.runner.protocol import RunnerSetup

MAX_CONFIG_BYTES = 4 * 1024 * 1024
"""A model's ``config.json`` read to choose its builder is at most this long (bytes)."""

BUILDERS: dict[ModelKind, str] = {
    "decoder": "worker.runner.text_builder:TextBuilder",
    "encoder": "worker.embed.engine:EncoderBuilder",  # embeddings and rerank (worker.embed)
    "image": "worker.image.engine:ImageBuilder",  # image pipelines run by mflux (worker.image)
}
"""The builder of each kind of model, as ``module:class`` (a kind missing here cannot be run
yet); the class is called with ``(setup, faults)``."""


VISION_BUILDER = "worker.vision.builder:VisionBuilder"
"""The builder of a decoder whose config has a ``vision_config`` (a vision-language model)."""


def takes_images(model_dir: str) -> bool:
    """Whether ``model_dir``'s ``config.json`` (bounded as ``kind_of_model`` reads it) has a
    ``vision_config``: its card lists ``vision`` (``exo_p2p.models.card.capabilities``)."""
    path = Path(model_dir) / "config.json"
    if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
        return False
    config = json.loads(path.read_text(encoding="utf-8"))
    return isinstance(config, dict) and isinstance(config.get("vision_config"), dict)


def kind_of_model(model_dir: str) -> ModelKind:
    """The kind of the model in ``model_dir`` (``exo_p2p.types.kinds.model_kind``). Raises
    ``ValueError`` for a ``config.json`` (an image pipeline's ``model_index.json``) missing, over ``MAX_CONFIG_BYTES`` or not a JSON
    object."""
    image = Path(model_dir) / "model_index.json"  # an image pipeline's (exo_p2p.types.kinds)
    path = image if image.is_file() else Path(model_dir) / "config.json"
    if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"{model_dir}: no config.json of at most {MAX_CONFIG_BYTES} bytes")
    config = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise ValueError(f"{path}: not a JSON object")
    files = [name for name in ("modules.json", "model_index.json") if (Path(model_dir) / name).is_file()]
    return model_kind(config, files)


def choose_builder(setup: RunnerSetup, faults: RunnerFaults) -> Builder:
    """The builder of ``setup``'s model. Raises ``ValueError`` for a kind no builder runs
    (the runner then fails with the message)."""
    kind = kind_of_model(setup.model_dir)
    where = VISION_BUILDER if kind == "decoder" and takes_images(setup.model_dir) else BUILDERS.get(kind)
    if where is None:
        raise ValueError(f"no runner builder for {kind} models yet (model {setup.instance.model_id})")
    module, _, name = where.partition(":")
    builder: Builder = getattr(importlib.import_module(module), name)(setup, faults)
    return builder
