"""Each family's answer to an embedding or rerank request, from the runner's vectors or
scores (docs/api.md#embeddings-and-reranking). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from exo_p2p.embeddings.vectors import to_base64

CROSS_ENCODER = "cross-encoder"
COSINE_FALLBACK = "embedding-cosine"


def scoring_of(tasks: Sequence[str]) -> str:
    """How a model with card ``tasks`` scores a rerank: ``cross-encoder`` for a model that
    only reranks (a relevance head, ``…ForSequenceClassification``), else
    ``embedding-cosine``, the cosine of the query's and each document's embeddings."""
    return COSINE_FALLBACK if "embed" in tasks else CROSS_ENCODER


def _floats(vector: np.ndarray) -> list[float]:
    return [float(x) for x in vector.tolist()]


def openai_answer(model: str, vectors: np.ndarray, tokens: int, encoding: str) -> dict[str, Any]:
    """OpenAI's ``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
    "model", "usage": {"prompt_tokens", "total_tokens"}}`` of ``vectors`` ``[N, D]``;
    ``embedding`` is base64 of float32 when ``encoding == "base64"``."""
    data = [{"object": "embedding", "index": i, "embedding": to_base64(v) if encoding == "base64" else _floats(v)}
            for i, v in enumerate(vectors)]
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def ollama_answer(model: str, vectors: np.ndarray, tokens: int, seconds: float) -> dict[str, Any]:
    """Ollama's ``/api/embed``: ``{"model", "embeddings", "total_duration" (ns),
    "load_duration", "prompt_eval_count"}``."""
    return {"model": model, "embeddings": [_floats(v) for v in vectors], "total_duration": int(seconds * 1e9),
            "load_duration": 0, "prompt_eval_count": tokens}


def ollama_legacy_answer(vectors: np.ndarray) -> dict[str, Any]:
    """Ollama's legacy ``/api/embeddings``: ``{"embedding": [...]}`` of the one prompt."""
    return {"embedding": _floats(vectors[0])}


def ranked(scores: Sequence[float], top_n: int | None) -> list[int]:
    """Document indices ordered by score, best first (ties: the earlier document first),
    cut to ``top_n`` (None: all)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return order if top_n is None else order[:top_n]


def rerank_answer(model: str, documents: Sequence[str], scores: Sequence[float], *, top_n: int | None,
                  return_documents: bool, tokens: int, scoring: str) -> dict[str, Any]:
    """Jina's/Cohere's ``{"model", "results": [{"index", "relevance_score", "document":
    {"text"}}], "usage": {"total_tokens"}, "meta": {"scoring"}}``; ``meta.scoring`` says how
    the scores were made (``scoring_of``). Raises ``ValueError`` when the scores do not match
    the documents (a runner's answer is checked, not trusted)."""
    if len(scores) != len(documents):
        raise ValueError(f"{len(scores)} scores for {len(documents)} documents")
    results = []
    for i in ranked(scores, top_n):
        entry: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if return_documents:
            entry["document"] = {"text": documents[i]}
        results.append(entry)
    return {"model": model, "results": results, "usage": {"total_tokens": tokens}, "meta": {"scoring": scoring}}
