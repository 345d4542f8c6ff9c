"""GGML tensor types read as affine groups, in numpy (pure functions, no MLX).

Every block-quantized GGML type this importer reads is, per group of ``g`` consecutive
elements of a row, ``w = scale × q + bias`` with an unsigned integer ``q`` of ``b`` bits —
the form of MLX's affine quantization. ``d``/``dmin``/``m`` are the block's float16 fields,
``sc``/``mn`` its small integer sub-block scales and mins (layouts: ggml's
``ggml-common.h``; the ``gguf`` package's ``gguf.quants`` is the reference the tests check
against):

=====  =====  =====  ====  ==================  ==================
type   block  group  bits  scale               bias
=====  =====  =====  ====  ==================  ==================
Q4_0   32     32     4     d                   -8 d
Q4_1   32     32     4     d                   m
Q5_0   32     32     5     d                   -16 d
Q5_1   32     32     5     d                   m
Q8_0   32     32     8     d                   -128 d
Q2_K   256    16     2     d sc                -dmin mn
Q3_K   256    16     3     d (sc - 32)         -4 d (sc - 32)
Q4_K   256    32     4     d sc                -dmin mn
Q5_K   256    32     5     d sc                -dmin mn
Q6_K   256    16     6     d sc                -32 d sc
=====  =====  =====  ====  ==================  ==================

Every scale and bias is exact in float32 (a float16 times an integer of at most 8 bits),
and in float16 for the five 32-element types (a float16 times a power of two).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class GgmlType:
    """One GGML tensor type: ``block`` elements take ``nbytes`` bytes; a quantized type has
    affine ``group`` (elements per scale/bias) and ``bits`` per element."""

    name: str
    block: int
    nbytes: int
    group: int | None = None
    bits: int | None = None


GGML_TYPES: dict[int, GgmlType] = {
    0: GgmlType("F32", 1, 4), 1: GgmlType("F16", 1, 2), 30: GgmlType("BF16", 1, 2),
    2: GgmlType("Q4_0", 32, 18, 32, 4), 3: GgmlType("Q4_1", 32, 20, 32, 4),
    6: GgmlType("Q5_0", 32, 22, 32, 5), 7: GgmlType("Q5_1", 32, 24, 32, 5),
    8: GgmlType("Q8_0", 32, 34, 32, 8),
    10: GgmlType("Q2_K", 256, 84, 16, 2), 11: GgmlType("Q3_K", 256, 110, 16, 3),
    12: GgmlType("Q4_K", 256, 144, 32, 4), 13: GgmlType("Q5_K", 256, 176, 32, 5),
    14: GgmlType("Q6_K", 256, 210, 16, 6),
}
"""The GGML types (``ggml.h`` ids) the importer reads."""

OTHER_TYPE_NAMES = {
    9: "Q8_1", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S",
    20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32",
    27: "I64", 28: "F64", 29: "IQ1_M", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}
"""Names of GGML types the importer does not read, for its error messages."""


def type_name(ggml_type: int) -> str:
    """``"Q4_K"`` for 12; ``"type 99"`` for an id ggml does not know."""
    known = GGML_TYPES.get(ggml_type)
    return known.name if known else OTHER_TYPE_NAMES.get(ggml_type, f"type {ggml_type}")


Affine = tuple[np.ndarray, np.ndarray, np.ndarray]
"""``(q, scales, biases)`` of ``n`` blocks: ``q`` uint8 ``[n, block]`` (unsigned), ``scales``
and ``biases`` float32 ``[n, block // group]``."""


def _f16(raw: np.ndarray) -> np.ndarray:
    """A ``[n, 2]`` uint8 column as float32 ``[n, 1]``."""
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """``[n, k]`` bytes -> ``[n, 2k]``: the k low nibbles, then the k high nibbles."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _bits_of(words: np.ndarray, count: int) -> np.ndarray:
    """``[n, 4]`` bytes (a little-endian uint32) -> ``[n, count]`` bits, bit 0 first."""
    value = np.ascontiguousarray(words).view("<u4")
    return ((value >> np.arange(count, dtype=np.uint32)) & 1).astype(np.uint8)


def _q4_0(b: np.ndarray) -> Affine:
    d = _f16(b[:, 0:2])
    return _nibbles(b[:, 2:18]), d, -8 * d


def _q4_1(b: np.ndarray) -> Affine:
    return _nibbles(b[:, 4:20]), _f16(b[:, 0:2]), _f16(b[:, 2:4])


def _q5_0(b: np.ndarray) -> Affine:
    d = _f16(b[:, 0:2])
    return _nibbles(b[:, 6:22]) | (_bits_of(b[:, 2:6], 32) << 4), d, -16 * d


def _q5_1(b: np.ndarray) -> Affine:
    q = _nibbles(b[:, 8:24]) | (_bits_of(b[:, 4:8], 32) << 4)
    return q, _f16(b[:, 0:2]), _f16(b[:, 2:4])


def _q8_0(b: np.ndarray) -> Affine:
    d = _f16(b[:, 0:2])
    return b[:, 2:34] ^ np.uint8(0x80), d, -128 * d  # int8 + 128 as uint8


def _crumbs(qs: np.ndarray) -> np.ndarray:
    """K-quant 2-bit fields: ``[n, 32·h]`` bytes -> ``[n, 128·h]``; element ``128 h' + 32 s
    + l`` is bits ``2s..2s+1`` of byte ``32 h' + l``."""
    n = qs.shape[0]
    shifted = qs.reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    return (shifted & 3).reshape(n, -1)


def _high_bits(mask: np.ndarray) -> np.ndarray:
    """``[n, 32]`` bytes -> ``[n, 256]``: element ``32 j + l`` is bit ``j`` of byte ``l``."""
    n = mask.shape[0]
    shifted = mask.reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    return (shifted & 1).reshape(n, 256)


def _q2_k(b: np.ndarray) -> Affine:
    sc = b[:, 0:16]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    return _crumbs(b[:, 16:80]), d * (sc & 0x0F), -dmin * (sc >> 4)


def _q3_k(b: np.ndarray) -> Affine:
    n = b.shape[0]
    raw = b[:, 96:108]
    low = _nibbles(raw[:, 0:8])  # [n, 16]: scales' low 4 bits
    high = (raw[:, 8:12].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1))
    sc = (low | ((high.reshape(n, 16) & 3) << 4)).astype(np.float32) - 32
    scale = _f16(b[:, 108:110]) * sc
    q = _crumbs(b[:, 32:96]) | (_high_bits(b[:, 0:32]) << 2)
    return q, scale, -4 * scale


def _k_scales(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 12 bytes -> eight 6-bit scales and eight 6-bit mins, ``[n, 8]`` each."""
    d, m, both = raw[:, 0:4], raw[:, 4:8], raw[:, 8:12]
    sc = np.concatenate([d & 0x3F, (both & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mn = np.concatenate([m & 0x3F, (both >> 4) | ((m >> 2) & 0x30)], axis=1)
    return sc, mn


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K: 128 bytes -> 256 nibbles; element ``64 c + 32 h + l`` is the low (h=0)
    or high (h=1) nibble of byte ``32 c + l``."""
    n = qs.shape[0]
    shifted = qs.reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (shifted & 0x0F).reshape(n, 256)


def _q4_k(b: np.ndarray) -> Affine:
    sc, mn = _k_scales(b[:, 4:16])
    return _k_nibbles(b[:, 16:144]), _f16(b[:, 0:2]) * sc, -_f16(b[:, 2:4]) * mn


def _q5_k(b: np.ndarray) -> Affine:
    sc, mn = _k_scales(b[:, 4:16])
    q = _k_nibbles(b[:, 48:176]) | (_high_bits(b[:, 16:48]) << 4)
    return q, _f16(b[:, 0:2]) * sc, -_f16(b[:, 2:4]) * mn


def _q6_k(b: np.ndarray) -> Affine:
    n = b.shape[0]
    low = b[:, 0:128].reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    q = (low & 0x0F).reshape(n, 256) | (_crumbs(b[:, 128:192]) << 4)
    scale = _f16(b[:, 208:210]) * b[:, 192:208].view(np.int8)
    return q, scale, -32 * scale


_AFFINE: dict[str, Callable[[np.ndarray], Affine]] = {
    "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
    "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k,
}


def affine_blocks(ggml_type: int, blocks: np.ndarray) -> Affine:
    """``(q, scales, biases)`` of ``blocks`` (uint8 ``[n, nbytes]``) of a quantized type
    (see the module table); ``w = scales × q + biases`` per group, in order.

    Raises:
        KeyError: ``ggml_type`` is not a quantized type of :data:`GGML_TYPES`.
    """
    q, scales, biases = _AFFINE[GGML_TYPES[ggml_type].name](blocks)
    return q, scales.astype(np.float32), biases.astype(np.float32)


def dequantize(ggml_type: int, raw: np.ndarray) -> np.ndarray:
    """Float32 values of ``raw`` (uint8 ``[rows, row_bytes]``), ``[rows, row_elements]``.

    Raises:
        KeyError: ``ggml_type`` is not in :data:`GGML_TYPES`.
    """
    kind = GGML_TYPES[ggml_type]
    rows = raw.shape[0]
    raw = np.ascontiguousarray(raw)
    if kind.name == "F32":
        return raw.view("<f4").reshape(rows, -1)
    if kind.name == "F16":
        return raw.view("<f2").astype(np.float32).reshape(rows, -1)
    if kind.name == "BF16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(rows, -1)
    q, scales, biases = affine_blocks(ggml_type, raw.reshape(-1, kind.nbytes))
    groups = q.reshape(q.shape[0], -1, kind.group).astype(np.float32)
    w = groups * scales[:, :, None] + biases[:, :, None]
    return w.reshape(rows, -1)


def pack_mlx(q: np.ndarray, bits: int) -> np.ndarray:
    """MLX's packed weight of unsigned ``q`` (uint8 ``[rows, cols]``, each < 2**bits):
    uint32 ``[rows, cols × bits / 32]``, the elements of a row as one little-endian bit
    stream (element ``i`` at bits ``i·bits …``), as ``mx.quantize`` packs them (checked by
    ``mx.dequantize`` in the tests). ``cols × bits`` must be a multiple of 32."""
    rows, cols = q.shape
    if bits in (2, 4, 8):  # whole elements per byte: pack bytes, read them as words
        per_byte = 8 // bits
        packed = q[:, 0::per_byte].copy()
        for k in range(1, per_byte):
            packed |= q[:, k::per_byte] << np.uint8(k * bits)
        return packed.view("<u4").reshape(rows, -1)
    # 3, 5 bits: 8 elements fill `bits` whole bytes; 6 bits: 4 elements fill 3 bytes
    per = 4 if bits == 6 else 8
    acc = np.zeros((rows, cols // per), np.uint64)
    for k in range(per):
        acc |= q[:, k::per].astype(np.uint64) << np.uint64(k * bits)
    whole = acc.view(np.uint8).reshape(rows, cols // per, 8)[:, :, :per * bits // 8]
    return np.ascontiguousarray(whole).reshape(rows, -1).view("<u4")
