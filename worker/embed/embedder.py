"""One model's embedding and rerank work on token rows: bound, batch, forward, pool
(docs/api.md#embeddings-and-reranking). An embedding is a prefill and a pool: it never joins
the decode batch and keeps no KV cache.

The rows of one request are forwarded together in batches of alike lengths
(``exo_p2p.embeddings.bounds.batches``, sorted by length so rows carry little padding); each
row's vector equals its vector alone (right padding, see ``decoder`` and ``encoder``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from exo_p2p.embeddings.bounds import BATCH_TOKENS, EmbedBoundError, batches, fit_lengths
from exo_p2p.embeddings.pooling import PoolingMode, PoolingSpec
from exo_p2p.embeddings.vectors import cosine, normalize, pool, truncate
from exo_p2p.types import Embedding, Rerank
from worker.embed.cross import pair_row

Rows = Sequence[Sequence[int]]


class Hidden(Protocol):
    """``(rows, lengths) -> [B, max(lengths), H]`` float32 final hidden states."""

    causal: bool

    def __call__(self, rows: list[list[int]], lengths: list[int]) -> np.ndarray: ...

    def share(self, vecs: np.ndarray) -> np.ndarray:
        """The pooled ``vecs [B, H]`` as the rank that answers holds them (one rank: ``vecs``;
        a pipeline: the last rank's, ``worker.embed.ring``)."""
        ...


class Embedder:
    """Vectors of one model: ``hidden`` its forward, ``spec`` its pooling, ``context`` its
    context in tokens, ``vocab`` its vocabulary size. ``head``: a cross-encoder's relevance
    head (``[B, H]`` pooled pairs → ``[B]`` scores, ``worker.embed.cross``); with one the
    model scores (query, document) pairs and does not embed."""

    def __init__(self, hidden: Hidden, spec: PoolingSpec, *, context: int, vocab: int,
                 head: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        self.hidden, self.spec = hidden, spec
        self.context, self.vocab = context, vocab
        self.head = head

    def task_rows(self, task: Embedding | Rerank) -> list[tuple[int, ...]]:
        """The token rows ``task`` forwards: an embedding's inputs; a rerank's query and
        documents, or with a ``head`` its (query, document) pairs (``cross.pair_row``).
        Raises ``EmbedBoundError`` for an embedding on a model with a ``head``."""
        if isinstance(task, Embedding):
            if self.head is not None:
                raise EmbedBoundError("this model is a cross-encoder: it scores (query, document) pairs and does "
                                      "not embed", "model")
            return list(task.params.inputs)
        p = task.params
        if self.head is None:
            return [p.query, *p.documents]
        return [tuple(pair_row(p.query, d)) for d in p.documents]

    def scores(self, vecs: np.ndarray) -> np.ndarray:
        """``[documents]`` relevance scores of a rerank's pooled rows (``task_rows``): the
        ``head``'s, else the cosine of the query's vector (row 0) with each document's (the
        fallback, ``embedding-cosine``)."""
        return self.head(vecs) if self.head is not None else cosine(vecs[0], vecs[1:])

    def check(self, rows: Rows) -> list[int]:
        """The rows' lengths. Raises ``EmbedBoundError`` for an empty row, a row over the
        context (the API node cut or refused it already: this guards the runner), a request
        over ``MAX_TOTAL_TOKENS`` or a token id outside the vocabulary."""
        for i, row in enumerate(rows):
            if any(not 0 <= t < self.vocab for t in row):
                raise EmbedBoundError(f"input {i} has a token id outside the model's vocabulary of {self.vocab}")
        return fit_lengths([len(r) for r in rows], self.context, truncate=False)

    def plan(self, rows: Rows, budget: int = BATCH_TOKENS) -> list[list[int]]:
        """The rows' indices in forward batches of alike lengths, each at most ``budget``
        padded tokens (``check``'s errors first)."""
        lengths = self.check(rows)
        order = sorted(range(len(rows)), key=lambda i: lengths[i])
        return [[order[g] for g in group] for group in batches([lengths[i] for i in order], budget)]

    def forward(self, rows: Rows, idx: list[int], mode: PoolingMode | None = None,
                normalise: bool | None = None) -> np.ndarray:
        """``[len(idx), H]`` vectors of rows ``idx`` in one forward, pooled by ``mode`` (None:
        the model's) and normalised when ``normalise`` (None: as the model says)."""
        lens = [len(rows[i]) for i in idx]
        vecs = self.hidden.share(pool(self.hidden([list(rows[i]) for i in idx], lens), lens, mode or self.spec.mode))
        return normalize(vecs) if (self.spec.normalize if normalise is None else normalise) else vecs

    def pooled(self, rows: Rows, mode: PoolingMode | None = None, normalise: bool | None = None) -> np.ndarray:
        """``[len(rows), H]`` vectors (``forward``) of all ``rows``, in ``plan``'s batches."""
        out: list[np.ndarray] = [np.empty(0)] * len(rows)
        for idx in self.plan(rows):
            for i, v in zip(idx, self.forward(rows, idx, mode, normalise)):
                out[i] = v
        return np.stack(out)

    def shorten(self, vecs: np.ndarray, dimensions: int | None, normalise: bool | None = None) -> np.ndarray:
        """``vecs`` cut to ``dimensions`` (Matryoshka; normalised again when normalising).
        Raises ``EmbedBoundError`` for ``dimensions`` other than the width on a model that
        lists no ``matryoshka_dimensions``, or over its width."""
        width = vecs.shape[1]
        if dimensions is None or dimensions == width:
            return vecs
        if not self.spec.matryoshka:
            raise EmbedBoundError(f"this model does not allow dimensions other than its width {width} "
                                  "(it lists no matryoshka_dimensions)", "dimensions")
        if dimensions > width:
            raise EmbedBoundError(f"dimensions {dimensions} is over the model's width {width}", "dimensions")
        return truncate(vecs, dimensions, renormalize=self.spec.normalize if normalise is None else normalise)

    def embed(self, rows: Rows, *, dimensions: int | None = None, mode: PoolingMode | None = None,
              normalise: bool | None = None) -> np.ndarray:
        """``[len(rows), D]`` float32 embeddings: ``pooled`` then ``shorten`` (their errors)."""
        return self.shorten(self.pooled(rows, mode, normalise), dimensions, normalise)

    def rerank(self, query: Sequence[int], documents: Rows) -> np.ndarray:
        """``[len(documents)]`` scores (``scores`` of the pooled ``task_rows``)."""
        if self.head is None:
            return self.scores(self.pooled([query, *documents]))
        return self.scores(self.pooled([pair_row(tuple(query), tuple(d)) for d in documents]))
