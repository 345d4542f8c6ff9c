"""An ``Embedder`` for a loaded model: a decoder from the engine's ``LoadedModel`` (mlx-lm;
whole, or a rank's share of a split one, ``worker.embed.ring``), an encoder from its directory (``mlx_embeddings``); pooling from the model's files
(``exo_p2p.embeddings.pooling``).
"""

from __future__ import annotations

from pathlib import Path

from exo_p2p.embeddings.pooling import PoolingSpec, pooling_spec
from exo_p2p.types.kinds import context_tokens
from worker.embed.cross import CrossEncoderError, PairHidden, load_cross_encoder
from worker.embed.decoder import DecoderHidden
from worker.embed.embedder import Embedder, Hidden
from worker.embed.encoder import EncoderHidden, load_encoder
from worker.embed.ring import PipelineHidden, RankedHidden
from worker.engine.layer_span import span_of
from worker.engine.loading.loader import LoadedModel
from worker.engine.pipeline import LocalStage, PipelineStage


def _vocab(config: dict) -> int:
    text = config.get("text_config", config)
    return int(text.get("vocab_size") or config.get("vocab_size") or 0)


def decoder_hidden(loaded: LoadedModel, stage: object = None) -> Hidden:
    """The forward of a decoder loaded by the engine's loader on a rank whose generation
    ``stage`` is given (None or a ``LocalStage``: the whole model; a ``PipelineStage``: its
    layer span, ``worker.embed.ring``; any other, a tensor rank: its sharded model). Raises
    ``ValueError`` for a pipeline rank's share without a ``PipelineStage``."""
    span = span_of(loaded.model)
    if span is not None and isinstance(stage, PipelineStage):
        return PipelineHidden(span, stage)
    hidden = DecoderHidden(loaded.model)
    return hidden if stage is None or isinstance(stage, LocalStage) else RankedHidden(hidden)


def decoder_embedder(loaded: LoadedModel, stage: object = None) -> Embedder:
    """The ``Embedder`` of a decoder loaded by the engine's loader (``decoder_hidden``'s
    forward; its errors, and ``PoolingConfigError`` for bad pooling files)."""
    spec = pooling_spec(loaded.model_dir, causal=True)
    hidden = decoder_hidden(loaded, stage)
    return Embedder(hidden, spec, context=loaded.context_length, vocab=_vocab(loaded.config))


def encoder_embedder(model_dir: Path | str) -> tuple[Embedder, object]:
    """``(embedder, tokenizer)`` of the encoder in ``model_dir`` (context: its
    ``max_position_embeddings``). Raises ``EncoderUnavailable`` without mlx-embeddings, the
    library's errors for a model it cannot read, ``PoolingConfigError`` for bad pooling files."""
    model, tokenizer = load_encoder(model_dir)
    config = model.config
    context = context_tokens({"model_type": getattr(config, "model_type", ""),
                              "max_position_embeddings": getattr(config, "max_position_embeddings", 0)}, 512)
    vocab = int(getattr(config, "vocab_size", 0))
    spec = pooling_spec(model_dir, causal=False)
    return Embedder(EncoderHidden(model), spec, context=context, vocab=vocab), tokenizer


def cross_embedder(model_dir: Path | str, arch: str) -> Embedder:
    """The ``Embedder`` of the ``arch`` cross-encoder in ``model_dir`` (``worker.embed.cross``):
    its pairs' ``[CLS]`` states through its relevance head (context as the card's,
    ``context_tokens``). Raises ``load_cross_encoder``'s errors, and ``CrossEncoderError`` for a
    tokenizer without a ``[SEP]`` token."""
    from transformers import AutoTokenizer

    model, head, config = load_cross_encoder(model_dir, arch)
    sep = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True).sep_token_id
    if sep is None:
        raise CrossEncoderError(f"{arch}: its tokenizer has no [SEP] token to pair a query with a document")
    return Embedder(PairHidden(model, int(sep)), PoolingSpec("cls", normalize=False),
                    context=context_tokens(config, 512), vocab=int(config.get("vocab_size", 0)), head=head)
