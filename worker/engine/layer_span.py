"""One pipeline rank's layers, run by the family's own forward (docs/architecture.md#engine).

A family's mlx-lm ``Model.__call__`` does more between the layers than call them: it scales
the embedding (gemma3_text), builds one mask per kind of layer from the cache of the first
layer of that kind (sliding-window and full attention: llama, gemma3_text, gpt_oss), picks a
layer's mask by its index or its attributes, and ends with the norm, a tied or untied head
and a soft cap. Rewriting that per family is where pipelines broke, so a rank runs the
family's own ``__call__`` on a *view* of its model whose layer list has the model's full
length:

- the layers of earlier ranks are ``_Before``: each returns the hidden states this rank
  received (so the first local layer gets them, whatever the embedding did);
- the layers of later ranks are ``_After``: the first one raises ``_RankEnd`` with its input,
  the output of this rank's last layer, and nothing after it runs;
- without the embedding (not the first rank) the view's ``embed_tokens`` gives zeros of the
  received shape, which only the masks' shapes read; without the norm and head (not the last
  rank) the view has modules there that are never reached (gpt_oss looks its head up first);
- the caches the family's code reads for layers this rank does not hold (to build a mask)
  are stand-ins: the cache of this rank's first layer of the same kind (class and window,
  ``stand_in_indices``) — it holds the same tokens, so the mask is the one the owner of that
  layer builds. A kind this rank does not hold makes a mask no local layer uses.

``LayerSpan`` is built by the loader from the full (lazy, nothing read) model before the
other ranks' layers are dropped: the empty caches the family's ``make_cache`` gives each
layer, and each layer's plain attributes (``use_sliding``: llama reads it in its loop), copied
onto the placeholders. The view shares every module and array with the model: it holds no
weights of its own. Families whose layers pass more than the hidden states between them
(shared KV caches, per-layer inputs) are refused at placement (``exo_p2p.models.card.families``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn


def cache_kind(cache: Any) -> tuple[str, int | None]:
    """What makes two layers' caches interchangeable for a mask: the class and, for a
    rotating (sliding-window) cache, its window (``max_size``)."""
    return type(cache).__name__, getattr(cache, "max_size", None)


def stand_in_indices(kinds: tuple[Any, ...], start: int, end: int) -> tuple[int, ...]:
    """For every layer ``i`` of a model whose layers have cache ``kinds``, the index (into
    this rank's local caches, layers ``[start, end)``) of the cache the view passes for it:
    ``i - start`` for a local layer, else the first local layer of the same kind, else 0.
    Raises ``ValueError`` for an empty or out-of-range span."""
    if not 0 <= start < end <= len(kinds):
        raise ValueError(f"layer range [{start}, {end}) is not within [0, {len(kinds)})")
    first: dict[Any, int] = {}
    for i in range(start, end):
        first.setdefault(kinds[i], i - start)
    return tuple(i - start if start <= i < end else first.get(kinds[i], 0) for i in range(len(kinds)))


class _RankEnd(Exception):
    """Raised by the first later-rank layer: ``h`` is this rank's output."""

    def __init__(self, h: mx.array) -> None:
        super().__init__("end of this rank's layers")
        self.h = h


class _Inbox:
    """The hidden states this rank received for the step being run."""

    h: mx.array | None = None


def _plain_attributes(layer: nn.Module) -> dict[str, Any]:
    return {k: v for k, v in vars(layer).items() if not k.startswith("_") and not callable(v)}


class _Before(nn.Module):
    """A layer of an earlier rank: its output is what this rank received."""

    def __init__(self, inbox: _Inbox, attributes: dict[str, Any]) -> None:
        super().__init__()
        for k, v in attributes.items():
            object.__setattr__(self, k, v)
        object.__setattr__(self, "_inbox", inbox)

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        assert self._inbox.h is not None
        return self._inbox.h


class _After(nn.Module):
    """A layer of a later rank: this rank's part ends before it."""

    def __init__(self, attributes: dict[str, Any]) -> None:
        super().__init__()
        for k, v in attributes.items():
            object.__setattr__(self, k, v)

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        raise _RankEnd(x)


class _Unreached(nn.Module):
    """Stands for the norm or head a rank before the last does not hold: its forward ends
    at ``_After`` first (a family may look the head up before it runs the layers)."""

    def __call__(self, x: mx.array) -> mx.array:
        raise AssertionError("a rank before the last ran the head")


class _NoEmbedding(nn.Module):
    """Stands for the embedding a later rank does not hold: zeros shaped like the received
    hidden states (read for the masks' shapes only)."""

    def __init__(self, inbox: _Inbox) -> None:
        super().__init__()
        object.__setattr__(self, "_inbox", inbox)

    def __call__(self, tokens: mx.array) -> mx.array:
        assert self._inbox.h is not None
        return mx.zeros_like(self._inbox.h)


@dataclass(eq=False)
class LayerSpan:
    """Layers ``[start, end)`` of an ``n_layers`` model on this rank (see module doc):
    ``templates`` the empty caches of the local layers (copied by ``new_cache``),
    ``stand_ins`` per model layer the local cache index the view passes for it, ``view`` the
    model with full-length layers. Built by ``make_span``."""

    start: int
    end: int
    n_layers: int
    templates: tuple[Any, ...]
    stand_ins: tuple[int, ...]
    view: nn.Module = field(repr=False)
    inbox: _Inbox = field(repr=False)

    @property
    def is_first(self) -> bool:
        return self.start == 0

    @property
    def is_last(self) -> bool:
        return self.end == self.n_layers

    def new_cache(self) -> list[Any]:
        """Fresh empty caches of the local layers, of the kinds the family gives them."""
        return [copy.deepcopy(t) for t in self.templates]

    def run(self, tokens: mx.array, cache: list[Any], received: mx.array | None, embeds: mx.array | None = None) -> mx.array:
        """Feed ``tokens [B, L]`` (first rank; ``embeds [B, L, hidden]`` in place of their
        embedding when given: a vision row's) or ``received [B, L, hidden]`` (the previous
        rank's output) through the local layers, appending to ``cache`` (one per local
        layer); returns the logits ``[B, L, vocab]`` on the last rank, else this rank's output
        ``[B, L, hidden]`` (lazy). Raises ``ValueError`` when ``received`` is missing on a
        later rank or ``cache`` does not have one entry per local layer."""
        if received is None and not self.is_first:
            raise ValueError(f"layers [{self.start}, {self.end}) need the previous rank's hidden states")
        if len(cache) != self.end - self.start:
            raise ValueError(f"{len(cache)} caches for layers [{self.start}, {self.end})")
        self.inbox.h = received
        extra = {} if embeds is None else {"input_embeddings": embeds}
        try:
            return self.view(tokens, cache=[cache[j] for j in self.stand_ins], **extra)
        except _RankEnd as end:
            return end.h
        finally:
            self.inbox.h = None

    def final_hidden(self, tokens: mx.array, received: mx.array | None) -> mx.array:
        """As ``run`` without a cache (an embedding's forward, docs/api.md#embeddings-and-reranking):
        the family's inner model, so the last rank returns the hidden states after the final
        norm and before the head ``[B, L, hidden]``; any other rank its output (lazy). Raises
        ``ValueError`` when ``received`` is missing on a later rank."""
        if received is None and not self.is_first:
            raise ValueError(f"layers [{self.start}, {self.end}) need the previous rank's hidden states")
        self.inbox.h = received
        try:
            return self.view.model(tokens)
        except _RankEnd as end:
            return end.h
        finally:
            self.inbox.h = None


def layer_facts(model: nn.Module) -> tuple[tuple[Any, ...], list[dict[str, Any]]]:
    """What ``make_span`` needs from the *full* model before its layers are dropped: every
    layer's empty cache (mlx-lm's ``make_prompt_cache``: the family's ``make_cache``) and
    every layer's plain attributes. Raises ``ValueError`` when the family gives another
    number of caches than layers (shared KV caches: its layers cannot be split)."""
    from mlx_lm.models.cache import make_prompt_cache

    layers = model.model.layers
    templates = tuple(make_prompt_cache(model))
    if len(templates) != len(layers):
        raise ValueError(f"{type(model).__module__} gives {len(templates)} caches for {len(layers)} layers: "
                         "its layers share caches and cannot be split into ranges")
    return templates, [_plain_attributes(layer) for layer in layers]


def make_span(model: nn.Module, start: int, end: int, templates: tuple[Any, ...],
              attributes: list[dict[str, Any]]) -> LayerSpan:
    """The ``LayerSpan`` of ``model`` whose ``model.model.layers`` already hold only layers
    ``[start, end)`` (the loader's partial model), from ``layer_facts``'s result on the full
    model. The view is a shallow copy of ``model`` and of ``model.model``: it shares every
    module and array."""
    n_layers = len(templates)
    inbox = _Inbox()
    local = list(model.model.layers)
    layers = ([_Before(inbox, attributes[i]) for i in range(start)] + local
              + [_After(attributes[i]) for i in range(end, n_layers)])
    inner = copy.copy(model.model)
    inner.layers = layers
    if "embed_tokens" not in model.model:
        inner.embed_tokens = _NoEmbedding(inbox)
    view = copy.copy(model)
    view.model = inner
    if end < n_layers:
        if "norm" not in inner:
            inner.norm = _Unreached()
        if "lm_head" not in view:
            view.lm_head = _Unreached()
    kinds = tuple(cache_kind(t) for t in templates)
    return LayerSpan(start, end, n_layers, templates[start:end], stand_in_indices(kinds, start, end), view, inbox)


def span_of(model: nn.Module) -> LayerSpan | None:
    """The ``LayerSpan`` the loader gave a partial ``model`` (``model.layer_span``), None for
    a whole model."""
    return getattr(model, "layer_span", None)
