"""Float32 weights for a CPU runner: quantized modules expanded at load, float tensors cast.

On a CPU-only node MLX's quantized matmul kernels are scalar loops and float16/bfloat16
matmuls are slow too, while a float32 matmul goes to the BLAS (OpenBLAS when the runner
preloads it, ``worker.blas``): 20× faster prefill and 2× faster decode on the embedded model.
When placement gives a shard ``weights_dtype="float32"`` the loader calls ``expand_to_float32``
on the *lazy* model (after choosing this rank's modules and tensor-sharding them), so each
layer is dequantized when it is evaluated and memory grows by its float32 bytes only:

- ``nn.QuantizedLinear`` → ``nn.Linear`` whose weight is ``mx.dequantize(weight, scales,
  biases, group_size, bits, mode, dtype=float32)`` with the scales and biases cast to float32
  first (exact: the affine dequantization in float32, ``w = q × scale + bias`` per group;
  with float16 scales MLX would compute it in float16);
- ``nn.QuantizedEmbedding`` → ``nn.Embedding`` (a tied head, ``as_linear``, then is a float32
  matmul), dequantized at once, a block of rows at a time (``_dequantized_in_place``: the
  vocabulary-sized tensor would otherwise need ~3.5× its float32 bytes while it is expanded);
- mlx's tensor-parallel ``QuantizedAllToShardedLinear`` / ``QuantizedShardedToAllLinear`` →
  ``AllToShardedLinear`` / ``ShardedToAllLinear`` (the slices are already this rank's);
- every other floating parameter (norms, float16 weights) → float32 (``set_dtype``).

``float32_wire`` makes every tensor-parallel all-reduce of a model sum in float32 and hand
back the dtype the rank computes in, so ranks holding different weights (float32 and
stored float16) exchange one dtype.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers.distributed import (
    AllToShardedLinear,
    QuantizedAllToShardedLinear,
    QuantizedShardedToAllLinear,
    ShardedToAllLinear,
)
from mlx.utils import tree_map_with_path

WEIGHTS_DTYPES = ("stored", "float32")
"""What a runner may hold (``ShardMetadata.weights_dtype``)."""


def _float32(array: mx.array | None) -> mx.array | None:
    """Affine scales or biases as float32: ``mx.dequantize`` computes ``q × scale + bias`` in
    the scales' dtype whatever its ``dtype`` argument, so float16 scales would round every
    weight. Other modes' scales (e8m0, e4m3 bytes) are left as they are."""
    if array is None or not mx.issubdtype(array.dtype, mx.floating):
        return array
    return array.astype(mx.float32)


def _dequantized(module: nn.Module) -> mx.array:
    return mx.dequantize(
        module["weight"],
        scales=_float32(module["scales"]),
        biases=_float32(module.get("biases")),
        group_size=module.group_size,
        bits=module.bits,
        mode=getattr(module, "mode", "affine"),
        dtype=mx.float32,
    )


EAGER_CHUNK_BYTES = 8 * 1024 * 1024
"""Float32 bytes dequantized per step when an embedding is expanded eagerly (bytes)."""


def _dequantized_in_place(module: nn.Module) -> mx.array:
    """``_dequantized(module)`` computed now, a block of rows at a time into one float32
    array (``EAGER_CHUNK_BYTES`` per block; each update is done in place): MLX's dequantize
    holds ~3.5× its output while it runs (measured: 378 MiB for the embedded model's 108 MiB
    embedding), this ~1.15×. Used for embeddings, the largest tensor of a small model, which
    a rank evaluates first anyway."""
    weight = module["weight"]
    rows = weight.shape[0]
    cols = weight.shape[1] * 32 // module.bits
    step = max(1, EAGER_CHUNK_BYTES // max(1, cols * 4))
    out = mx.zeros((rows, cols), dtype=mx.float32)
    mx.eval(out)
    biases = module.get("biases")
    for start in range(0, rows, step):
        end = min(rows, start + step)
        out[start:end] = mx.dequantize(
            weight[start:end], scales=_float32(module["scales"][start:end]),
            biases=_float32(biases[start:end]) if biases is not None else None,
            group_size=module.group_size, bits=module.bits, mode=getattr(module, "mode", "affine"), dtype=mx.float32,
        )
        mx.eval(out)
    return out


def _expanded(module: nn.Module) -> nn.Module:
    """The float32 replacement of one quantized leaf module (lazy), or the module itself."""
    if isinstance(module, (QuantizedShardedToAllLinear, QuantizedAllToShardedLinear)):
        weight = _dequantized(module)
        out_dims, in_dims = weight.shape
        cls = ShardedToAllLinear if isinstance(module, QuantizedShardedToAllLinear) else AllToShardedLinear
        group = module.group
        size = group.size()
        if cls is ShardedToAllLinear:
            new = cls(in_dims * size, out_dims, "bias" in module, group)
        else:
            new = cls(in_dims, out_dims * size, "bias" in module, group)
        new.weight = weight
        if "bias" in module:
            new.bias = module["bias"].astype(mx.float32)
        return new
    if isinstance(module, nn.QuantizedLinear):
        weight = _dequantized(module)
        new = nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in module)
        new.weight = weight
        if "bias" in module:
            new.bias = module["bias"].astype(mx.float32)
        return new
    if isinstance(module, nn.QuantizedEmbedding):
        weight = _dequantized_in_place(module)
        new = nn.Embedding(weight.shape[0], weight.shape[1])
        new.weight = weight
        return new
    return module


def expand_to_float32(model: nn.Module) -> None:
    """Replace, in place, every quantized module of ``model`` by its float32 equivalent and
    cast every other floating parameter to float32 (see the module docstring). Lazy, but for
    the embedding (expanded here, in blocks): the layers are read and expanded when their
    parameters are evaluated."""
    leaves = tree_map_with_path(lambda _path, m: _expanded(m), model.leaf_modules(), is_leaf=nn.Module.is_module)
    model.update_modules(leaves)
    model.set_dtype(mx.float32)


class _Float32SumShardedToAll(ShardedToAllLinear):
    """``ShardedToAllLinear`` whose all-reduce is summed in float32 (``float32_wire``)."""

    def __call__(self, x: mx.array) -> mx.array:
        y = x @ self["weight"].T
        y = mx.distributed.all_sum(y.astype(mx.float32), group=self.group).astype(y.dtype)
        if "bias" in self:
            y = y + self["bias"]
        return y


class _Float32SumQuantizedShardedToAll(QuantizedShardedToAllLinear):
    """``QuantizedShardedToAllLinear`` whose all-reduce is summed in float32 (``float32_wire``)."""

    def __call__(self, x: mx.array) -> mx.array:
        y = mx.quantized_matmul(
            x, self["weight"], scales=self["scales"], biases=self.get("biases"), transpose=True,
            group_size=self.group_size, bits=self.bits, mode=self.mode,
        )
        y = mx.distributed.all_sum(y.astype(mx.float32), group=self.group).astype(y.dtype)
        if "bias" in self:
            y = y + self["bias"]
        return y


def float32_wire(model: nn.Module) -> int:
    """Make every sharded-to-all linear of a tensor-sharded ``model`` all-reduce in float32
    (each rank then goes on in its own compute dtype). Same parameters, new ``__call__``:
    the modules' classes are swapped for subclasses that only change the reduction's dtype.
    Returns how many modules were changed."""
    changed = 0
    for _, module in model.named_modules():
        if type(module) is ShardedToAllLinear:
            module.__class__ = _Float32SumShardedToAll
            changed += 1
        elif type(module) is QuantizedShardedToAllLinear:
            module.__class__ = _Float32SumQuantizedShardedToAll
            changed += 1
    return changed
