"""A verification pass on every kind of stage: each row's greedy token at every position and
its sampled token at the first, the same on every rank.

``LocalStage``: computed here. ``TensorStage``: rank 0 (the one with the head that samples)
computes them; ``PipelineStage``: the last rank does, after the ``1 + K`` positions travelled
the ring once (``PipelineStage.every_position``). Either way they are shared with one
``all_sum`` (the other ranks add zeros), as an ordinary step shares its tokens, so every rank
accepts the same drafts, rolls back the same positions and proposes the same next drafts
(they come from agreed tokens only: no extra agreement round).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from worker.engine.pipeline import LocalStage, PipelineStage, logprobs_of, sample_rows
from worker.engine.ring_wait import all_sum_length
from worker.engine.sampling import Sampler
from worker.engine.spec.rejection import rejection_row
from worker.engine.tensor import TensorStage


def verifies(stage: object, samplers: Sequence[Sampler]) -> bool:
    """Whether ``stage`` can run a verification pass for rows drawn by ``samplers``: a local,
    tensor or pipeline stage; on a multi-rank one, no row asking for logprobs (their records
    travel with the ordinary step's tokens only)."""
    if type(stage) is LocalStage:
        return True
    return type(stage) in (TensorStage, PipelineStage) and all(s.top_logprobs is None for s in samplers)


class _Argmax:
    """Stands in for a row's sampler at position 0 when its tokens come from ``rejection_row``."""

    plain_greedy = True

    def __call__(self, logprobs: mx.array) -> mx.array:
        return mx.argmax(logprobs, axis=-1)


def choose(logits: mx.array, samplers: Sequence[Sampler], drafts: Sequence[Sequence[int]] = ()) -> mx.array:
    """``[B, L, vocab]`` logits → ``[B, L + 1]`` int32 (lazy): columns ``0 … L−1`` the argmax
    at each position — for a sampled row with ``drafts[i]`` (``Sampler.plain_sampled``), its
    tokens by the rejection rule (``rejection.rejection_row``) instead —, column ``L`` row
    ``i``'s draw by ``samplers[i]`` at position 0 (not drawn for those rows)."""
    tokens = mx.argmax(logits, axis=-1).astype(mx.int32)
    sampled = [i for i, s in enumerate(samplers) if i < len(drafts) and drafts[i] and s.plain_sampled]
    stand_ins: list[Any] = [_Argmax() if i in sampled else s for i, s in enumerate(samplers)]
    first = sample_rows(stand_ins, logprobs_of(logits[:, :1, :])).astype(mx.int32)
    rows = mx.arange(tokens.shape[0])[:, None]
    for i in sampled:
        logprobs = logits[i] - mx.logsumexp(logits[i], axis=-1, keepdims=True)
        tokens = mx.where(rows == i, rejection_row(samplers[i], logprobs, list(drafts[i]))[None, :], tokens)
    return mx.concatenate([tokens, first[:, None]], axis=1)


def verify_tokens(stage: Any, model: Any, tokens: mx.array, cache: list[Any], samplers: Sequence[Sampler],
                  drafts: Sequence[Sequence[int]] = ()) -> mx.array:
    """Feed ``tokens [B, L]`` through ``stage`` (every rank at the same point) and return
    ``choose``'s ``[B, L + 1]`` (lazy; ``drafts`` row by row), the same on every rank. Raises ``TypeError`` for a
    stage ``verifies`` refuses."""
    rows, width = tokens.shape[0], tokens.shape[1] + 1
    if type(stage) is LocalStage:
        return choose(stage.forward(model, tokens, cache), samplers, drafts)
    if type(stage) is TensorStage:
        if stage.rank == 0:
            out = choose(stage.forward(model, tokens, cache), samplers, drafts)
        else:
            out = mx.depends(mx.zeros((rows, width), dtype=mx.int32), model.model(tokens, cache=cache))
        return mx.distributed.all_sum(out, group=stage.group)
    if type(stage) is PipelineStage:
        h = stage.every_position(model, tokens, cache)
        size = rows * width
        padding = all_sum_length(size, stage.world_size) - size  # every ring segment holds bytes
        if stage.is_last:
            flat = choose(h, samplers, drafts).reshape(-1)
        else:
            if stage.wait.active:  # this rank's part done, asleep until the last rank's tokens come
                mx.eval(h)
                stage.wait.from_either()
            flat = mx.depends(mx.zeros((size,), dtype=mx.int32), h)
        if padding:
            flat = mx.concatenate([flat, mx.zeros((padding,), dtype=mx.int32)])
        return mx.distributed.all_sum(flat, group=stage.group)[:size].reshape(rows, width)
    raise TypeError(f"no verification pass on a {type(stage).__name__}")
