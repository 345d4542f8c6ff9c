"""Bytes of quantized KV, for capacity and admission (docs/architecture.md "Quantized KV cache").

``mx.quantize`` stores a vector of ``dim`` elements at ``bits`` bits as ``dim × bits / 32``
``uint32`` words plus, per group of ``group_size`` elements, a scale and a bias in the
vector's own dtype (``elem_bytes``). One token of one KV head is a key and a value vector.
"""

from __future__ import annotations

KV_BITS = (0, 4, 8)
"""The KV cache's allowed bits (0: full precision, the default)."""

GROUP_SIZE = 64
"""Elements sharing one scale and bias (mlx-lm's ``QuantizedKVCache`` default)."""


def group_size(head_dim: int) -> int:
    """The quantization group of a head of ``head_dim`` elements: ``GROUP_SIZE``, or 32 for a
    head that is a multiple of 32 but not of 64 (``mx.quantize`` allows 32, 64, 128). Raises
    ``ValueError`` for any other head size (the model cannot use a quantized KV cache)."""
    if head_dim % GROUP_SIZE == 0:
        return GROUP_SIZE
    if head_dim % 32 == 0:
        return 32
    raise ValueError(f"a quantized KV cache needs a head size that is a multiple of 32, not {head_dim}; "
                     "run this model with --kv-cache-bits 0")


def vector_bytes(dim: int, elem_bytes: int, bits: int) -> int:
    """Bytes of one vector of ``dim`` elements: ``dim × elem_bytes`` at full precision (``bits``
    0), else its packed words plus a scale and a bias per group. Raises ``ValueError`` for
    bits outside ``KV_BITS``."""
    if bits not in KV_BITS:
        raise ValueError(f"kv cache bits must be one of {KV_BITS}, not {bits}")
    if bits == 0:
        return dim * elem_bytes
    return dim * bits // 8 + 2 * (dim // group_size(dim)) * elem_bytes


def token_bytes(kv_heads: int, head_dim: int, elem_bytes: int, bits: int) -> int:
    """Bytes one token adds to one layer's KV: ``kv_heads`` keys and values."""
    return kv_heads * 2 * vector_bytes(head_dim, elem_bytes, bits)
