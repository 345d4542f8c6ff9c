"""Sampled rows' drafts: the standard rejection-sampling rule, so the output distribution is
the target's (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding"; Chen et al. 2023).

A prompt-lookup draft proposes its token ``x`` with certainty (the draft distribution ``q``
is a point mass), and then the rule — accept ``x`` with probability ``min(1, p(x)/q(x)) =
p(x)``, else draw from the residual ``max(p − q, 0)`` normalized, i.e. ``p`` without ``x`` —
is exactly: draw ``y`` from ``p`` and accept the draft when ``y == x`` (then ``P(accept) =
p(x)``, and a rejected position's ``y`` is distributed as ``p`` given ``y ≠ x``, the
residual). So each position is drawn as an ordinary step draws it — the row's own
distribution (``Sampler.distribution``) and the key of that position
(``Sampler.key_seeds``: from the request's seed and the token's position) — and a seeded
row's tokens are the very tokens it gets with speculation off, in a batch or alone.
"""

from __future__ import annotations

import mlx.core as mx

from worker.engine.sampling import Sampler


def rejection_row(sampler: Sampler, logprobs: mx.array, drafts: list[int]) -> mx.array:
    """Row tokens ``[L]`` int32 (lazy) from its normalized log-probabilities ``logprobs [L,
    vocab]`` at the ``L`` positions of a verification pass, ``drafts`` (at most ``L − 1``)
    fed after its current token: column ``j`` is the draw at position ``j``. The caller
    accepts the drafts up to the first column that differs from them, takes the column after
    as the next token and calls ``sampler.skip(accepted + 1)``. Raises ``ValueError`` for a
    greedy sampler or too many drafts."""
    if sampler.temperature == 0:
        raise ValueError("rejection sampling needs a sampled row")
    length = logprobs.shape[0]
    if len(drafts) >= length:
        raise ValueError(f"{len(drafts)} drafts for {length} positions")
    scaled = sampler.distribution(logprobs)
    draws = [mx.random.categorical(scaled[j : j + 1], key=mx.random.key(seed)).reshape(-1)
             for j, seed in enumerate(sampler.key_seeds(length))]
    return mx.concatenate(draws).astype(mx.int32)
