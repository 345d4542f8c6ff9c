"""Read the header of a GGUF file (metadata and tensor infos) without reading its weights.

Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md — little endian; magic
``GGUF``, uint32 version (2 or 3), uint64 tensor count, uint64 metadata count, then the
metadata key/values, then one info per tensor (name, dims innermost first, ggml type,
offset). Reading the header of a 100 MB model takes tens of milliseconds, so a node can list
a GGUF (:func:`exo_p2p.models.card.card_from_gguf`) without importing it.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from exo_p2p.models.errors import UnsupportedModelError

GGUF_MAGIC = b"GGUF"

# GGUF metadata value types -> struct format of a scalar.
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                   10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9

# ggml tensor types (ggml.h).
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GGML_Q4_K = 0, 1, 2, 3, 8, 12
GGML_I8, GGML_I16, GGML_I32 = 24, 25, 26

# How mlx.core.load converts each ggml type (mlx/io/gguf.cpp, gguf_quants.cpp): these are
# quantized to MLX affine format (uint32-packed weight + float16 scales + float16 biases,
# group 32); the plain types are copied; every other type is dequantized to float16.
MLX_QUANTIZED_BITS = {GGML_Q4_0: 4, GGML_Q4_1: 4, GGML_Q4_K: 4, GGML_Q8_0: 8}
MLX_GGUF_GROUP_SIZE = 32
_MLX_PLAIN_ITEMSIZE = {GGML_F32: 4, GGML_F16: 2, GGML_I8: 1, GGML_I16: 2, GGML_I32: 4}


@dataclass(frozen=True)
class GgufTensorInfo:
    """One tensor of a GGUF: ``shape`` in MLX/numpy order (outermost first, the reverse of
    GGUF's ``ne``), ``ggml_type`` as in ggml.h."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int

    @property
    def n_elements(self) -> int:
        """Number of scalar elements."""
        return math.prod(self.shape)

    def mlx_tensors(self) -> dict[str, tuple[tuple[int, ...], int]]:
        """The tensors ``mx.load`` makes of this one: name -> (shape, bytes).

        A quantized ``x.weight`` becomes ``x.weight`` (uint32, last dim × bits / 32),
        ``x.scales`` and ``x.biases`` (float16, last dim / 32).
        """
        bits = MLX_QUANTIZED_BITS.get(self.ggml_type)
        if bits is None:
            itemsize = _MLX_PLAIN_ITEMSIZE.get(self.ggml_type, 2)
            return {self.name: (self.shape, self.n_elements * itemsize)}
        *outer, last = self.shape
        packed = (*outer, last * bits // 32)
        groups = (*outer, last // MLX_GGUF_GROUP_SIZE)
        prefix = self.name.removesuffix(".weight")
        return {
            self.name: (packed, math.prod(packed) * 4),
            f"{prefix}.scales": (groups, math.prod(groups) * 2),
            f"{prefix}.biases": (groups, math.prod(groups) * 2),
        }


@dataclass(frozen=True)
class GgufHeader:
    """Metadata (key -> Python value: int, float, bool, str or list) and tensor infos."""

    version: int
    metadata: dict[str, Any]
    tensors: tuple[GgufTensorInfo, ...]


def read_gguf_header(path: Path) -> GgufHeader:
    """Parse the header of the GGUF at ``path``.

    Raises:
        UnsupportedModelError: not a GGUF file (bad magic), an unknown version or value
            type, or a truncated header.
    """
    with open(path, "rb", buffering=1 << 20) as f:
        try:
            return _read_header(f, path)
        except struct.error as e:
            raise UnsupportedModelError(f"{path}: truncated GGUF header ({e})") from e


def _read_header(f: BinaryIO, path: Path) -> GgufHeader:
    if f.read(4) != GGUF_MAGIC:
        raise UnsupportedModelError(f"{path}: not a GGUF file (magic is not 'GGUF')")
    (version,) = _unpack(f, "<I")
    if version not in (2, 3):
        raise UnsupportedModelError(f"{path}: GGUF version {version} is not supported (2, 3)")
    n_tensors, n_kv = _unpack(f, "<QQ")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = _read_string(f)
        (value_type,) = _unpack(f, "<I")
        metadata[key] = _read_value(f, value_type, path)
    tensors = []
    for _ in range(n_tensors):
        name = _read_string(f)
        (n_dims,) = _unpack(f, "<I")
        ne = _unpack(f, f"<{n_dims}Q")
        ggml_type, _offset = _unpack(f, "<IQ")
        tensors.append(GgufTensorInfo(name, tuple(reversed(ne)), ggml_type))
    return GgufHeader(version, metadata, tuple(tensors))


def _unpack(f: BinaryIO, fmt: str) -> tuple[Any, ...]:
    size = struct.calcsize(fmt)
    return struct.unpack(fmt, f.read(size))


def _read_string(f: BinaryIO) -> str:
    (length,) = _unpack(f, "<Q")
    return f.read(length).decode("utf-8", errors="replace")


def _read_value(f: BinaryIO, value_type: int, path: Path) -> Any:
    if value_type == _STRING:
        return _read_string(f)
    if value_type == _ARRAY:
        item_type, count = _unpack(f, "<IQ")
        if item_type in _SCALAR_FORMATS:
            fmt = _SCALAR_FORMATS[item_type]
            return list(_unpack(f, f"<{count}{fmt[1:]}"))
        return [_read_value(f, item_type, path) for _ in range(count)]
    fmt = _SCALAR_FORMATS.get(value_type)
    if fmt is None:
        raise UnsupportedModelError(f"{path}: unknown GGUF metadata value type {value_type}")
    return _unpack(f, fmt)[0]
