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
from worker.engine.tensor import TensorStage


def verifies(stage: object, samplers: Sequence[Sampler]) -> bool:
    """Whether ``stage`` can run a verification pass for rows drawn by ``samplers``: a local,
    tensor or pipeline stage; on a multi-rank one, no row asking for logprobs (their records
    travel with the ordinary step's tokens only)."""
    if type(stage) is LocalStage:
        return True
    return type(stage) in (TensorStage, PipelineStage) and all(s.top_logprobs is None for s in samplers)


def choose(logits: mx.array, samplers: Sequence[Sampler]) -> mx.array:
    """``[B, L, vocab]`` logits → ``[B, L + 1]`` int32 (lazy): columns ``0 … L−1`` the argmax
    at each position, column ``L`` row ``i``'s draw by ``samplers[i]`` at position 0."""
    greedy = mx.argmax(logits, axis=-1).astype(mx.int32)
    first = sample_rows(samplers, logprobs_of(logits[:, :1, :])).astype(mx.int32)
    return mx.concatenate([greedy, first[:, None]], axis=1)


def verify_tokens(stage: Any, model: Any, tokens: mx.array, cache: list[Any], samplers: Sequence[Sampler]) -> mx.array:
    """Feed ``tokens [B, L]`` through ``stage`` (every rank at the same point) and return
    ``choose``'s ``[B, L + 1]`` (lazy), the same on every rank. Raises ``TypeError`` for a
    stage ``verifies`` refuses."""
    rows, width = tokens.shape[0], tokens.shape[1] + 1
    if type(stage) is LocalStage:
        return choose(stage.forward(model, tokens, cache), samplers)
    if type(stage) is TensorStage:
        if stage.rank == 0:
            out = choose(stage.forward(model, tokens, cache), samplers)
        else:
            out = mx.depends(mx.zeros((rows, width), dtype=mx.int32), model.model(tokens, cache=cache))
        return mx.distributed.all_sum(out, group=stage.group)
    if type(stage) is PipelineStage:
        h = stage.every_position(model, tokens, cache)
        size = rows * width
        padding = all_sum_length(size, stage.world_size) - size  # every ring segment holds bytes
        if stage.is_last:
            flat = choose(h, samplers).reshape(-1)
        else:
            if stage.wait.active:  # this rank's part done, asleep until the last rank's tokens come
                mx.eval(h)
                stage.wait.from_either()
            flat = mx.depends(mx.zeros((size,), dtype=mx.int32), h)
        if padding:
            flat = mx.concatenate([flat, mx.zeros((padding,), dtype=mx.int32)])
        return mx.distributed.all_sum(flat, group=stage.group)[:size].reshape(rows, width)
    raise TypeError(f"no verification pass on a {type(stage).__name__}")
