"""Vectors from hidden states: pooling, normalisation, Matryoshka truncation, base64 — pure
numpy (float32), so the runner, the API and the oracle tests share one definition.

Rows are right-padded: row ``i`` holds ``lengths[i]`` real tokens, then padding that no rule
reads (an encoder's mask hides it from the real tokens; a decoder's causal mask does too).
"""

from __future__ import annotations

import base64

import numpy as np

from exo_p2p.embeddings.pooling import PoolingMode

NORM_EPS = 1e-12
"""The smallest norm divided by (a zero vector stays zero)."""


def pool(hidden: np.ndarray, lengths: np.ndarray | list[int], mode: PoolingMode) -> np.ndarray:
    """``hidden`` ``[B, L, H]`` (row ``i``'s first ``lengths[i]`` positions real, each ≥ 1)
    → ``[B, H]`` float32: ``mean`` of the real tokens, ``cls`` the first token, ``last`` the
    last real one. Raises ``ValueError`` for a length outside ``[1, L]`` or an unknown mode."""
    hidden = np.asarray(hidden, dtype=np.float32)
    lens = np.asarray(lengths, dtype=np.int64)
    if hidden.ndim != 3 or lens.shape != (hidden.shape[0],):
        raise ValueError(f"hidden {hidden.shape} and lengths {lens.shape} do not match")
    if lens.size and (lens.min() < 1 or lens.max() > hidden.shape[1]):
        raise ValueError(f"lengths must be within [1, {hidden.shape[1]}]")
    if mode == "cls":
        return hidden[:, 0, :].copy()
    if mode == "last":
        return hidden[np.arange(hidden.shape[0]), lens - 1, :].copy()
    if mode == "mean":
        mask = (np.arange(hidden.shape[1])[None, :] < lens[:, None]).astype(np.float32)
        return (hidden * mask[:, :, None]).sum(axis=1) / lens[:, None].astype(np.float32)
    raise ValueError(f"unknown pooling mode {mode!r}")


def normalize(vectors: np.ndarray) -> np.ndarray:
    """Each row scaled to unit L2 length (a zero row stays zero); float32."""
    v = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(v, axis=-1, keepdims=True)
    return v / np.maximum(norms, NORM_EPS)


def truncate(vectors: np.ndarray, dimensions: int | None, *, renormalize: bool) -> np.ndarray:
    """The first ``dimensions`` values of each row (Matryoshka shortening, as OpenAI's
    ``dimensions``), scaled back to unit length when ``renormalize``; None keeps them all.
    Raises ``ValueError`` for a ``dimensions`` outside ``[1, width]``."""
    if dimensions is None:
        return vectors
    width = vectors.shape[-1]
    if not 1 <= dimensions <= width:
        raise ValueError(f"dimensions must be within [1, {width}]")
    cut = vectors[..., :dimensions]
    return normalize(cut) if renormalize else cut


def to_base64(vector: np.ndarray) -> str:
    """One vector as base64 of its little-endian float32 bytes (what OpenAI's
    ``encoding_format: "base64"`` returns and its client decodes with ``np.frombuffer``)."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def from_base64(text: str) -> np.ndarray:
    """The inverse of ``to_base64``. Raises ``ValueError`` for text that is not base64 of a
    whole number of float32s."""
    raw = base64.b64decode(text, validate=True)
    if len(raw) % 4:
        raise ValueError("base64 vector is not a whole number of float32 values")
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of ``a`` ``[H]`` with each row of ``b`` ``[N, H]`` → ``[N]``
    (0 against a zero vector)."""
    return normalize(np.asarray(b, dtype=np.float32)) @ normalize(np.asarray(a, dtype=np.float32)[None, :])[0]
