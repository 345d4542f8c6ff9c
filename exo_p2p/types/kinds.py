"""Which kinds of work a model can do, from its files (docs/architecture.md#how-to-add-a-kind-of-work).

Pure rules over a model's ``config.json`` (a dict) and the names of its files; the card maker
(``exo_p2p.models``) stores the answer in ``ModelCard.tasks``, the master admits and routes by
it (``master.task_kinds``), the runner chooses its builder by ``model_kind``.

- a causal language model (an ``architectures`` entry ending in ``ForCausalLM`` or
  ``ForConditionalGeneration``, or no ``architectures`` at all: mlx-lm's default) generates
  embeds (pooling its final hidden state) and reranks by the cosine of embeddings;
- an encoder (a BERT-like ``model_type``, ``…ForMaskedLM``, sentence-transformers' ``modules.json``)
  embeds only; with a sequence-classification head (``…ForSequenceClassification``: a
  cross-encoder) it reranks; an encoder embedding model also reranks by the cosine of
  embeddings (the documented fallback, docs/api.md).
- an image pipeline (a diffusers-layout ``model_index.json`` whose ``_class_name`` is in
  ``IMAGE_PIPELINES``: FLUX.2-klein, run by mflux) makes images and edits them
  (docs/images.md#models); its files hold no root ``config.json``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Literal

from exo_p2p.types.models import ModelCard
from exo_p2p.types.tasks import TaskKind

ModelKind = Literal["decoder", "encoder", "image"]
"""How a model is built and run: its runner's builder (``worker.runner.builders``)."""

CAUSAL_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")
"""``architectures`` suffixes of models that generate."""
ENCODER_SUFFIXES = ("ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "BertModel", "RobertaModel")
"""``architectures`` suffixes of encoders."""
ENCODER_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "modernbert", "distilbert", "nomic_bert", "new", "electra"})
"""``model_type`` values of encoders (read as such even without ``architectures``)."""


IMAGE_PIPELINES: dict[str, tuple[TaskKind, ...]] = {"Flux2KleinPipeline": ("image", "image_edit")}
"""``model_index.json`` ``_class_name`` → what that image pipeline does (the ones the image runner
builds, ``worker.image.load``)."""


def image_tasks(model_index: Mapping[str, Any]) -> tuple[TaskKind, ...]:
    """What the image pipeline of ``model_index`` (its ``model_index.json``) does: empty for a
    pipeline class the image runner does not build."""
    return IMAGE_PIPELINES.get(str(model_index.get("_class_name", "")), ())


def model_kind(config: Mapping[str, Any], files: Collection[str] = ()) -> ModelKind:
    """``"decoder"``, ``"encoder"`` or ``"image"`` for a model with ``config`` (its
    ``config.json``, or for an image pipeline its ``model_index.json``) and ``files`` (names
    relative to its directory). See the module docstring."""
    if "model_index.json" in files:
        return "image"
    archs = [str(a) for a in config.get("architectures") or ()]
    if any(a.endswith(CAUSAL_SUFFIXES) for a in archs):
        return "decoder"
    if str(config.get("model_type", "")).lower() in ENCODER_TYPES or "modules.json" in files:
        return "encoder"
    if any(a.endswith(ENCODER_SUFFIXES) for a in archs):
        return "encoder"
    return "decoder"


def model_tasks(config: Mapping[str, Any], files: Collection[str] = ()) -> tuple[TaskKind, ...]:
    """The kinds of work a model can do (``ModelCard.tasks``), in ``TASK_KINDS`` order."""
    if model_kind(config, files) == "image":
        return image_tasks(config)
    if model_kind(config, files) == "decoder":
        return ("generate", "embed", "rerank")  # rerank: the cosine of embeddings (docs/api.md)
    archs = [str(a) for a in config.get("architectures") or ()]
    if any(a.endswith("ForSequenceClassification") for a in archs):
        return ("rerank",)
    return ("embed", "rerank")


def card_tasks(card: ModelCard) -> tuple[TaskKind, ...]:
    """What ``card``'s model can do: its ``tasks``, or generation alone on a card from before
    kinds (an event log written then holds cards without ``tasks``)."""
    return card.tasks or ("generate",)  # type: ignore[return-value]


POSITION_OFFSET_TYPES = frozenset({"roberta", "xlm_roberta"})
"""Encoder families whose position ids start after the padding index (``padding_idx + 1`` = 2)."""


def context_tokens(config: Mapping[str, Any], default: int) -> int:
    """The tokens one input of a model with ``config`` may hold: ``max_position_embeddings``
    (``default`` without one), less the two positions the RoBERTa families keep before the
    first token (XLM-RoBERTa's 514 positions hold 512 tokens)."""
    positions = config.get("max_position_embeddings")
    if not positions:
        return default
    offset = 2 if str(config.get("model_type", "")).replace("-", "_") in POSITION_OFFSET_TYPES else 0
    return int(positions) - offset
