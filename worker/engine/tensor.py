"""Tensor parallel: every rank holds 1/world_size of every layer and runs the same forward.

Sharding is mlx-lm's own (``Model.shard(group)``, e.g. ``mlx_lm/models/llama.py``), built on
``mlx.nn.layers.distributed.shard_linear``: in every layer ``q/k/v_proj`` and
``gate/up_proj`` become *all-to-sharded* (each rank keeps ``out/N`` output rows: its heads,
its kv heads, its slice of the MLP) and ``o_proj`` / ``down_proj`` become *sharded-to-all*
(each rank keeps ``in/N`` input columns and the layer ends with an ``all_sum``), so after
every attention and MLP block all ranks hold the same hidden states. The embedding, the norms
and the head stay whole on every rank (the non-layer tensors, docs/architecture.md#rules).

Quantized linears shard through ``QuantizedAllToShardedLinear`` /
``QuantizedShardedToAllLinear``: the packed ``weight [out, in·bits/32]``, ``scales`` and
``biases [out, in/group_size]`` are split along the same axis. Splitting rows (all-to-sharded)
never crosses a quantization group; splitting columns (sharded-to-all) is exact only when each
rank's ``in/N`` inputs are whole groups, i.e. ``(in / N) % group_size == 0`` — mlx-lm does not
check this (it would silently mis-slice), so ``shard_problem`` does. SmolLM2-135M (hidden 576,
9 heads of 64, 3 kv heads, MLP 1536, 4-bit group 32) over 3 ranks: ``o_proj`` 576/3 = 192 = 6
groups, ``down_proj`` 1536/3 = 512 = 16 groups — exact.

``TensorStage`` is one rank's part of a generation step: every rank runs the whole (sharded)
forward — the collectives are inside the sharded layers, in the same order on every rank —
and rank 0 alone applies the head and samples; its token is shared with ``all_sum`` (rank 0
adds its token, the others 0), so every rank ends each step with the same token whatever tiny
differences the reductions might leave (same rule as ``pipeline.PipelineStage``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from worker.engine.forward import Forward, forward
from worker.engine.pipeline import logprobs_of, sample_rows
from worker.engine.sampling import Sampler

_ALL_TO_SHARDED = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_SHARDED_TO_ALL = ("o_proj", "down_proj")


def _linear_dims(module: nn.Module) -> tuple[int, int, int | None]:
    """``(out, in, group_size or None)`` of a (quantized) linear, from its weight's shape."""
    out, cols = module.weight.shape
    if isinstance(module, nn.QuantizedLinear):
        return out, cols * 32 // module.bits, module.group_size
    return out, cols, None


def _linears(layer: nn.Module) -> dict[str, nn.Module]:
    found = {}
    for block in ("self_attn", "mlp"):
        sub = getattr(layer, block, None)
        for name in _ALL_TO_SHARDED + _SHARDED_TO_ALL:
            if sub is not None and hasattr(sub, name):
                found[f"{block}.{name}"] = getattr(sub, name)
    return found


def shard_problem(model: nn.Module, world_size: int) -> str | None:
    """Why ``model`` cannot be tensor-sharded over ``world_size`` ranks, or None if it can.

    Checks (on the lazy model: nothing is read): the architecture has mlx-lm's ``shard``;
    attention heads and kv heads divide by ``world_size`` (each rank keeps whole heads); every
    all-to-sharded linear's output and every sharded-to-all linear's input divide by it; and for
    a quantized sharded-to-all linear each rank's ``in / world_size`` inputs are whole
    quantization groups (``group_size``), else the packed columns would be cut mid-group.
    """
    if world_size < 1:
        return f"world size must be at least 1, not {world_size}"
    if not callable(getattr(model, "shard", None)):
        return f"{type(model).__module__} models have no tensor sharding in mlx-lm"
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not layers:
        return f"{type(model).__module__} models have no model.layers"
    for i, layer in enumerate(layers):
        attn = getattr(layer, "self_attn", None)
        for attr, what in (("n_heads", "attention heads"), ("n_kv_heads", "kv heads")):
            count = getattr(attn, attr, None)
            if count is not None and count % world_size:
                return f"tensor sharding needs {count} {what} divisible by {world_size}"
        for name, lin in _linears(layer).items():
            out, inp, group_size = _linear_dims(lin)
            if name.split(".")[1] in _ALL_TO_SHARDED:
                if out % world_size:
                    return f"layer {i} {name}: {out} outputs do not divide by {world_size}"
            elif inp % world_size:
                return f"layer {i} {name}: {inp} inputs do not divide by {world_size}"
            elif group_size is not None and (inp // world_size) % group_size:
                return (f"layer {i} {name}: {inp} inputs / {world_size} ranks = {inp // world_size}, "
                        f"not whole quantization groups of {group_size}")
    return None


def shard_model(model: nn.Module, group: mx.distributed.Group) -> None:
    """Shard ``model``'s layers in place over ``group`` (mlx-lm's ``model.shard``). Call it on
    the *lazy* model: the sharded parameters are then lazy slices of the mapped tensors, and
    evaluating them one at a time reads each full tensor once and keeps only this rank's part.

    Raises ``ValueError`` with ``shard_problem``'s reason when the model cannot be sharded.
    """
    if problem := shard_problem(model, group.size()):
        raise ValueError(problem)
    model.shard(group)


class TensorStage:
    """Rank ``group.rank()`` of a tensor-parallel instance (see module doc). Every rank calls
    ``prefill`` / ``next_token`` at the same points (the engine's steps, in lockstep)."""

    def __init__(self, group: mx.distributed.Group, forward_fn: Forward = forward) -> None:
        self.group = group
        self.rank = group.rank()
        self.world_size = group.size()
        self.forward = forward_fn
        self.samples = self.rank == 0

    def prefill(self, model: nn.Module, tokens: mx.array, cache: list[Any]) -> None:
        """Feed ``tokens [B, L]`` into this rank's KV cache (its kv heads) and evaluate."""
        model.model(tokens, cache=cache)  # the cache state depends on every layer's collectives
        mx.eval([c.state for c in cache])

    def next_token(self, model: nn.Module, tokens: mx.array, cache: list[Any], sampler: Sampler) -> mx.array:
        """The lazy next token ``[1]`` (int32), the same on every rank: rank 0's sample."""
        return self.next_tokens(model, tokens, cache, [sampler])

    def next_tokens(self, model: nn.Module, tokens: mx.array, cache: list[Any],
                    samplers: Sequence[Sampler]) -> mx.array:
        """The lazy next tokens ``[B]`` (int32) of a batch, the same on every rank: rank 0's."""
        return self.sample(self.forward_last(model, tokens, cache), samplers)

    def forward_last(self, model: nn.Module, tokens: mx.array, cache: list[Any]) -> mx.array:
        """Rank 0: the last position's log-probabilities ``[B, vocab]`` (lazy); elsewhere
        this rank's hidden states (no head: only rank 0 samples)."""
        if self.rank == 0:
            return logprobs_of(self.forward(model, tokens, cache))
        return model.model(tokens, cache=cache)

    def sample(self, pending: mx.array, samplers: Sequence[Sampler]) -> mx.array:
        """Rank 0's draw from ``pending``, shared with every rank (``all_sum``)."""
        if self.rank == 0:
            token = sample_rows(samplers, pending).astype(mx.int32)
        else:
            token = mx.depends(mx.zeros((pending.shape[0],), dtype=mx.int32), pending)
        return mx.distributed.all_sum(token, group=self.group)
