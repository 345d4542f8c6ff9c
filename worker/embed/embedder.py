"""One model's embedding and rerank work on token rows: bound, batch, forward, pool
(docs/api.md#embeddings-and-reranking). An embedding is a prefill and a pool: it never joins
the decode batch and keeps no KV cache.

The rows of one request are forwarded together in batches of alike lengths
(``exo_p2p.embeddings.bounds.batches``, sorted by length so rows carry little padding); each
row's vector equals its vector alone (right padding, see ``decoder`` and ``encoder``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from exo_p2p.embeddings.bounds import EmbedBoundError, batches, fit_lengths
from exo_p2p.embeddings.pooling import PoolingMode, PoolingSpec
from exo_p2p.embeddings.vectors import cosine, normalize, pool, truncate

Rows = Sequence[Sequence[int]]


class Hidden(Protocol):
    """``(rows, lengths) -> [B, max(lengths), H]`` float32 final hidden states."""

    causal: bool

    def __call__(self, rows: list[list[int]], lengths: list[int]) -> np.ndarray: ...


class Embedder:
    """Vectors of one model: ``hidden`` its forward, ``spec`` its pooling, ``context`` its
    context in tokens, ``vocab`` its vocabulary size."""

    def __init__(self, hidden: Hidden, spec: PoolingSpec, *, context: int, vocab: int) -> None:
        self.hidden, self.spec = hidden, spec
        self.context, self.vocab = context, vocab

    def check(self, rows: Rows) -> list[int]:
        """The rows' lengths. Raises ``EmbedBoundError`` for an empty row, a row over the
        context (the API node cut or refused it already: this guards the runner), a request
        over ``MAX_TOTAL_TOKENS`` or a token id outside the vocabulary."""
        for i, row in enumerate(rows):
            if any(not 0 <= t < self.vocab for t in row):
                raise EmbedBoundError(f"input {i} has a token id outside the model's vocabulary of {self.vocab}")
        return fit_lengths([len(r) for r in rows], self.context, truncate=False)

    def pooled(self, rows: Rows, mode: PoolingMode | None = None, normalise: bool | None = None) -> np.ndarray:
        """``[len(rows), H]`` vectors pooled by ``mode`` (None: the model's) and normalised
        when ``normalise`` (None: as the model says), forwarded in bounded batches."""
        lengths = self.check(rows)
        mode = mode or self.spec.mode
        normalise = self.spec.normalize if normalise is None else normalise
        order = sorted(range(len(rows)), key=lambda i: lengths[i])
        out: list[np.ndarray] = [np.empty(0)] * len(rows)
        for group in batches([lengths[i] for i in order]):
            idx = [order[g] for g in group]
            lens = [lengths[i] for i in idx]
            vecs = pool(self.hidden([list(rows[i]) for i in idx], lens), lens, mode)
            vecs = normalize(vecs) if normalise else vecs
            for j, i in enumerate(idx):
                out[i] = vecs[j]
        return np.stack(out)

    def embed(self, rows: Rows, *, dimensions: int | None = None, mode: PoolingMode | None = None,
              normalise: bool | None = None) -> np.ndarray:
        """``[len(rows), D]`` float32 embeddings (``pooled``), shortened to ``dimensions``
        (Matryoshka, normalised again when normalising). Raises ``EmbedBoundError`` (a 400)
        as ``check``, and for ``dimensions`` other than the width on a model that lists no
        ``matryoshka_dimensions`` or over its width."""
        vecs = self.pooled(rows, mode, normalise)
        width = vecs.shape[1]
        if dimensions is not None and dimensions != width:
            if not self.spec.matryoshka:
                raise EmbedBoundError(f"this model does not allow dimensions other than its width {width} "
                                      "(it lists no matryoshka_dimensions)", "dimensions")
            if dimensions > width:
                raise EmbedBoundError(f"dimensions {dimensions} is over the model's width {width}", "dimensions")
            vecs = truncate(vecs, dimensions, renormalize=self.spec.normalize if normalise is None else normalise)
        return vecs

    def rerank(self, query: Sequence[int], documents: Rows) -> np.ndarray:
        """``[len(documents)]`` scores: the cosine of the query's embedding with each
        document's (the fallback for a model without a relevance head, ``embedding-cosine``)."""
        vecs = self.pooled([query, *documents])
        return cosine(vecs[0], vecs[1:])
