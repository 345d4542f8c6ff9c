"""Loading a model (or one pipeline rank's share of it) with progress, through mlx-lm.

``load_model`` is a generator: it yields ``LoadProgress`` as layers reach memory and ends
with one ``LoadedModel``. Model classes, ``sanitize`` and quantization (config.json's
``quantization`` incl. per-module overrides) are mlx-lm's own (``mlx_lm.utils.load_model``
with ``lazy=True``): ``mx.load`` of a safetensors file only maps tensors, and a tensor is
read when it is evaluated. We then keep only the modules this rank needs and evaluate them
one layer at a time, so memory grows progressively and a pipeline rank never reads the
other ranks' layers (docs/architecture.md#rules "share"): layers ``[start_layer, end_layer)``, plus the
token embedding on the first rank and the final norm and head on the last (with tied
embeddings the head *is* the embedding).

A tensor-parallel rank (``tensor_group``) loads every layer but only its 1/world_size of each
(``engine.tensor.shard_model`` on the lazy model, then each tensor evaluated on its own, so a
full tensor is read and dropped at once and memory grows by this rank's part only), plus all
the non-layer tensors.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load_config, load_tokenizer
from mlx_lm.utils import load_model as mlx_lm_load_model

from worker.engine.loading.dequantize import WEIGHTS_DTYPES, expand_to_float32

END_OF_TURN_TOKENS: tuple[str, ...] = (
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>",
)
"""Special tokens that end a turn whenever the model's vocabulary has them."""

DEFAULT_CONTEXT_LENGTH = 4096
"""Context (tokens) assumed when neither config.json nor the tokenizer states one."""


@dataclass(frozen=True)
class LoadProgress:
    """``layers_loaded`` of this rank's ``layers_total`` layers are in memory."""

    layers_loaded: int
    layers_total: int


@dataclass
class LoadedModel:
    """A model (or one pipeline rank's part of it) ready to run.

    ``model`` is the mlx-lm model; on a partial load ``model.layers`` holds only layers
    ``[start_layer, end_layer)`` and the modules this rank does not need are removed
    (``model.model.embed_tokens`` when not first and not a tied last rank, ``model.model.norm``
    and ``lm_head`` when not last), and ``model.layer_span`` runs them with the family's own
    forward (``engine.layer_span``; its caches are ``forward.new_cache``'s). ``eos_token_ids``:
    every end-of-turn token id. ``context_length`` in tokens; ``peak_memory_bytes`` is
    ``mx.get_peak_memory()`` over the load (reset at its start). ``tensor_world_size`` > 1:
    every layer holds only this rank's 1/tensor_world_size (``engine.tensor``).
    ``weights_dtype``: ``"stored"`` (as on disk) or ``"float32"`` (expanded at load,
    ``engine.loading.dequantize``).
    """

    model: nn.Module
    tokenizer: TokenizerWrapper
    eos_token_ids: frozenset[int]
    context_length: int
    peak_memory_bytes: int
    model_dir: Path
    n_layers: int
    start_layer: int
    end_layer: int
    config: dict[str, Any] = field(repr=False, default_factory=dict)
    tensor_world_size: int = 1
    weights_dtype: str = "stored"

    @property
    def is_first(self) -> bool:
        """This rank embeds the tokens."""
        return self.start_layer == 0

    @property
    def is_last(self) -> bool:
        """This rank computes the logits."""
        return self.end_layer == self.n_layers

    @property
    def is_full(self) -> bool:
        return self.is_first and self.is_last


def _text_config(config: dict) -> dict:
    return config.get("text_config", config)


def layer_count(model_dir: Path) -> int:
    """Number of transformer layers in config.json (``num_hidden_layers``)."""
    return int(_text_config(load_config(Path(model_dir)))["num_hidden_layers"])


def context_length_of(config: dict, tokenizer: TokenizerWrapper | None = None) -> int:
    """Context length in tokens: config.json's ``max_position_embeddings`` (or a
    ``text_config``'s), else the tokenizer's ``model_max_length`` when plausible, else
    ``DEFAULT_CONTEXT_LENGTH``."""
    for key in ("max_position_embeddings", "max_sequence_length", "n_ctx", "seq_length"):
        value = _text_config(config).get(key) or config.get(key)
        if value:
            return int(value)
    mml = getattr(tokenizer, "model_max_length", None) if tokenizer is not None else None
    if isinstance(mml, int) and 0 < mml < 10_000_000:
        return mml
    return DEFAULT_CONTEXT_LENGTH


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def eos_token_ids_of(model_dir: Path, config: dict, tokenizer: TokenizerWrapper) -> frozenset[int]:
    """Every token that ends a turn: config.json's and generation_config.json's
    ``eos_token_id``, the tokenizer's eos, and ``END_OF_TURN_TOKENS`` found in its vocab."""
    ids = set(_as_id_list(config.get("eos_token_id")))
    gen_path = Path(model_dir) / "generation_config.json"
    if gen_path.exists():
        ids.update(_as_id_list(json.loads(gen_path.read_text()).get("eos_token_id")))
    ids.update(tokenizer.eos_token_ids)
    vocab = tokenizer.get_vocab()
    ids.update(vocab[t] for t in END_OF_TURN_TOKENS if t in vocab)
    return frozenset(ids)


def _shard_modules(model: nn.Module, start: int, end: int, n_layers: int, tied: bool) -> None:
    """Keep only what layers ``[start, end)`` of an ``n_layers`` model need (in place)."""
    inner = model.model
    inner.layers = inner.layers[start:end]
    first, last = start == 0, end == n_layers
    if not first and not (last and tied):
        del inner["embed_tokens"]
    if not last:
        del inner["norm"]
        if "lm_head" in model:
            del model["lm_head"]


def _checked_range(config: dict, start_layer: int, end_layer: int | None,
                   tensor_group: mx.distributed.Group | None, weights_dtype: str) -> tuple[int, int]:
    """The model's layer count and the range's end, or ``ValueError`` for an unknown weights
    dtype, a range outside the model, or a tensor rank given a layer range."""
    if weights_dtype not in WEIGHTS_DTYPES:
        raise ValueError(f"unknown weights dtype {weights_dtype!r}; use one of {', '.join(WEIGHTS_DTYPES)}")
    n_layers = int(_text_config(config)["num_hidden_layers"])
    end = n_layers if end_layer is None else end_layer
    if not 0 <= start_layer < end <= n_layers:
        raise ValueError(f"layer range [{start_layer}, {end}) is not within [0, {n_layers})")
    if tensor_group is not None and tensor_group.size() > 1 and (start_layer, end) != (0, n_layers):
        raise ValueError(f"a tensor rank loads every layer, not [{start_layer}, {end})")
    return n_layers, end


def _lazy_share(model_dir: Path, start_layer: int, end: int, n_layers: int,
                tensor_group: mx.distributed.Group | None, weights_dtype: str) -> tuple[nn.Module, dict]:
    """The model with only this rank's modules (layers ``[start_layer, end)``, or its tensor
    shard of every layer), weights not read yet (lazy), and its config."""
    from worker.engine.layer_span import layer_facts, make_span

    partial = (start_layer, end) != (0, n_layers)
    model, config = mlx_lm_load_model(model_dir, lazy=True, strict=not partial)
    if partial and not hasattr(model, "model") and hasattr(getattr(model, "language_model", None), "model"):
        model = model.language_model  # a vision model's text part (mlx-lm's qwen2_vl): the model a rank splits
    if partial:
        if not hasattr(model, "model") or not hasattr(model.model, "layers"):
            raise ValueError(f"{config.get('model_type')} models cannot be split into layer ranges")
        templates, attributes = layer_facts(model)  # the whole model's, before its layers go
        tied = bool(_text_config(config).get("tie_word_embeddings", True)) and "lm_head" not in model
        _shard_modules(model, start_layer, end, n_layers, tied)
    if tensor_group is not None and tensor_group.size() > 1:
        from worker.engine.tensor import shard_model

        shard_model(model, tensor_group)
    if weights_dtype == "float32":
        expand_to_float32(model)
    if partial:  # the view shares the modules as they are now (expand_to_float32 replaces some)
        object.__setattr__(model, "layer_span", make_span(model, start_layer, end, templates, attributes))
    return model, config


def load_model(
    model_dir: Path | str, *, start_layer: int = 0, end_layer: int | None = None,
    tensor_group: mx.distributed.Group | None = None, weights_dtype: str = "stored",
) -> Iterator[LoadProgress | LoadedModel]:
    """Load layers ``[start_layer, end_layer)`` (default: all) of the MLX-format model in
    ``model_dir`` and the tensors that rank needs; yield ``LoadProgress(0, n)`` first, then
    one ``LoadProgress`` per layer in memory, then the ``LoadedModel``. With ``tensor_group``
    (a group of 2 or more ranks; all layers only) load this rank's tensor shard of every layer.
    ``weights_dtype``: ``"stored"`` keeps the weights as on disk; ``"float32"`` expands them
    at load (``engine.loading.dequantize.expand_to_float32``, layer by layer, after the rank's
    modules are chosen and sharded).

    Raises ``FileNotFoundError`` (no config.json / safetensors) and ``ValueError`` (bad layer
    range, unknown architecture) from the first ``next()``; ``ValueError`` for a model that
    cannot be tensor-sharded over the group (``engine.tensor.shard_problem``) before any
    tensor is read.
    """
    model_dir = Path(model_dir)
    config = load_config(model_dir)
    n_layers, end = _checked_range(config, start_layer, end_layer, tensor_group, weights_dtype)
    partial = (start_layer, end) != (0, n_layers)
    total = end - start_layer
    tensor = tensor_group is not None and tensor_group.size() > 1

    mx.synchronize()
    mx.clear_cache()
    mx.reset_peak_memory()
    yield LoadProgress(0, total)

    model, config = _lazy_share(model_dir, start_layer, end, n_layers, tensor_group, weights_dtype)
    layers = model.layers
    layer_ids = {id(p) for layer in layers for _, p in _flat(layer.parameters())}
    non_layer = [p for _, p in _flat(model.parameters()) if id(p) not in layer_ids]
    mx.eval(non_layer)  # embedding / norm / head first: the first rank needs them at once
    for i, layer in enumerate(layers):
        if tensor:  # one tensor at a time: each full tensor is read, sliced and dropped
            for _, p in _flat(layer.parameters()):
                mx.eval(p)
        else:
            mx.eval(layer.parameters())
        yield LoadProgress(i + 1, total)

    tokenizer = load_tokenizer(model_dir, eos_token_ids=config.get("eos_token_id"))
    yield LoadedModel(
        model=model,
        tokenizer=tokenizer,
        eos_token_ids=eos_token_ids_of(model_dir, config, tokenizer),
        context_length=context_length_of(config, tokenizer),
        peak_memory_bytes=int(mx.get_peak_memory()),
        model_dir=model_dir,
        n_layers=n_layers,
        start_layer=start_layer,
        end_layer=end,
        config=config,
        tensor_world_size=tensor_group.size() if tensor and tensor_group is not None else 1,
        weights_dtype=weights_dtype,
    )


def load_all(model_dir: Path | str, **kwargs: Any) -> LoadedModel:
    """Run ``load_model`` to the end and return its ``LoadedModel`` (tests, scripts)."""
    loaded = None
    for item in load_model(model_dir, **kwargs):
        if isinstance(item, LoadedModel):
            loaded = item
    assert loaded is not None
    return loaded


def _flat(tree: Any) -> list[tuple[str, mx.array]]:
    from mlx.utils import tree_flatten

    return tree_flatten(tree)
