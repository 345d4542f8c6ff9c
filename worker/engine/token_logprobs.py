"""Log-probabilities of the generated tokens (``GenerationParams.logprobs``).

Which distribution: the model's own, ``log_softmax`` of the last position's logits
(``pipeline.logprobs_of``) before anything the request's sampling changes — logit bias,
penalties, an output format's mask, temperature, top-p/top-k/min-p, a forced end of
reasoning. This is vLLM's default (``logprobs_mode="raw_logprobs"``) and what OpenAI
documents ("the log probability of this token" under the model); for a run without logits
processors it equals what ``mlx_lm.generate.generate_step`` yields beside each token.

A draw's record is one lazy float32 vector ``[token, logprob, id_1 … id_k, lp_1 … lp_k]``
(``record``; ids as floats are exact below 2**24, far above any vocabulary), built where the
token is drawn: the sampling rank. A pipeline's last rank samples while rank 0 emits, so the
records travel with the tokens in the same all-sum (``pack`` / ``unpack``), ``2 + 2·k`` floats
per row, k ≤ ``MAX_TOP_LOGPROBS``. ``read`` turns an evaluated record into the chunk's
``TokenLogprobs``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx

from exo_p2p.types.chunks import TokenLogprob, TokenLogprobs
from exo_p2p.types.tasks import MAX_TOP_LOGPROBS


def width(k: int) -> int:
    """Floats in the record of a draw with ``k`` alternatives."""
    return 2 + 2 * k


def record(logprobs: mx.array, token: mx.array, k: int) -> mx.array:
    """The record (see the module docstring) of ``token`` (``[1]`` int) drawn from the row
    ``logprobs`` ``[1, vocab]`` with its ``k`` (0..``MAX_TOP_LOGPROBS``) most likely tokens,
    most likely first; lazy, ``[2 + 2k]`` float32. Raises ``ValueError`` for ``k`` out of range."""
    if not 0 <= k <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top logprobs must be in 0..{MAX_TOP_LOGPROBS}, not {k}")
    row = logprobs.reshape(-1).astype(mx.float32)
    tok = token.reshape(-1)[:1].astype(mx.int32)
    parts = [tok.astype(mx.float32), row[tok]]
    if k:
        k = min(k, row.shape[0])
        ids = mx.argpartition(-row, kth=k - 1)[:k]
        order = mx.argsort(-row[ids])
        ids = ids[order]
        parts += [ids.astype(mx.float32), row[ids]]
    return mx.concatenate(parts)


def pack(tokens: mx.array, records: Sequence[mx.array | None], k: int) -> mx.array:
    """``[rows, 2 + 2k]`` float32: row ``i`` the record of ``tokens[i]`` padded with zeros,
    or the token alone when ``records[i]`` is None (its request asked for no logprobs)."""
    w = width(k)
    rows = []
    for i, rec in enumerate(records):
        if rec is None:
            rec = tokens[i : i + 1].astype(mx.float32)
        rows.append(mx.concatenate([rec, mx.zeros((w - rec.shape[0],), dtype=mx.float32)]) if rec.shape[0] < w else rec)
    return mx.stack(rows)


def unpack(summed: mx.array, rows: int, ks: Sequence[int | None]) -> tuple[mx.array, list[mx.array | None]]:
    """The tokens ``[rows]`` (int32) and each row's record (None where ``ks[i]`` is None) of a
    ``pack``-ed matrix after the all-sum, ``summed`` flat (padding rows after ``rows``)."""
    k_max = max((k for k in ks if k is not None), default=0)
    matrix = summed[: rows * width(k_max)].reshape(rows, width(k_max))
    tokens = matrix[:, 0].astype(mx.int32)
    return tokens, [None if k is None else matrix[i, : width(k)] for i, k in enumerate(ks)]


def read(values: Sequence[float], k: int, text_of: Callable[[int], str]) -> TokenLogprobs:
    """The ``TokenLogprobs`` of an evaluated record (``values``: its floats) with ``k``
    alternatives; ``text_of`` gives a token id's text."""
    chosen = int(values[0])
    ids = [int(v) for v in values[2 : 2 + k]]
    lps = values[2 + k : 2 + 2 * k]
    top = tuple(TokenLogprob(i, text_of(i), float(lp)) for i, lp in zip(ids, lps, strict=True))
    return TokenLogprobs(TokenLogprob(chosen, text_of(chosen), float(values[1])), top)
