"""Read the header of a GGUF file (metadata and tensor infos) without reading its weights.

Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md — little endian; magic
``GGUF``, uint32 version (2 or 3), uint64 tensor count, uint64 metadata count, then the
metadata key/values, then one info per tensor (name, dims innermost first, ggml type,
offset), then the tensor data from the next multiple of ``general.alignment``. Reading the header of a 100 MB model takes tens of milliseconds, so a node can list
a GGUF (:func:`exo_p2p.models.card.derive.card_from_gguf`) without importing it.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.gguf.quants import GGML_TYPES, dequantize, type_name

GGUF_MAGIC = b"GGUF"

# GGUF metadata value types -> struct format of a scalar.
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                   10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9

DEFAULT_ALIGNMENT = 32
"""Bytes the tensor data is aligned to when ``general.alignment`` does not say."""


@dataclass(frozen=True)
class GgufTensorInfo:
    """One tensor of a GGUF: ``shape`` in MLX/numpy order (outermost first, the reverse of
    GGUF's ``ne``), ``ggml_type`` as in ggml.h, ``offset`` of its data in bytes from the
    start of the data section (:attr:`GgufHeader.data_offset`)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int = 0

    @property
    def n_elements(self) -> int:
        """Number of scalar elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of its data in the file.

        Raises:
            UnsupportedModelError: a GGML type this importer does not read (named).
        """
        kind = GGML_TYPES.get(self.ggml_type)
        if kind is None:
            raise unsupported_type(self)
        return self.n_elements // kind.block * kind.nbytes


@dataclass(frozen=True)
class GgufHeader:
    """Metadata (key -> Python value: int, float, bool, str or list) and tensor infos."""

    version: int
    metadata: dict[str, Any]
    tensors: tuple[GgufTensorInfo, ...]
    data_offset: int = 0
    """Where the tensor data starts in the file (bytes; aligned)."""


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


def read_float_tensor(path: Path, header: GgufHeader, name: str) -> np.ndarray:
    """The values of the GGUF tensor ``name`` as float32, in its shape (for the small
    tensors a config holds, such as rope factors: reads only that tensor's bytes).

    Raises:
        UnsupportedModelError: no such tensor, an unsupported type, or a truncated file.
    """
    info = next((t for t in header.tensors if t.name == name), None)
    if info is None:
        raise UnsupportedModelError(f"{path}: GGUF has no tensor {name!r}")
    raw = np.fromfile(path, np.uint8, count=info.nbytes, offset=header.data_offset + info.offset)
    if raw.size != info.nbytes:
        raise UnsupportedModelError(f"{path}: GGUF tensor {name!r} is truncated")
    rows = math.prod(info.shape[:-1]) if len(info.shape) > 1 else 1
    return dequantize(info.ggml_type, raw.reshape(rows, -1)).reshape(info.shape)


def unsupported_type(info: GgufTensorInfo) -> UnsupportedModelError:
    """The error for a tensor whose GGML type the importer does not read (names both)."""
    return UnsupportedModelError(
        f"GGUF tensor {info.name!r} has tensor type {type_name(info.ggml_type)}, which is not "
        f"supported (supported: {', '.join(t.name for t in GGML_TYPES.values())})")


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
        ggml_type, offset = _unpack(f, "<IQ")
        tensors.append(GgufTensorInfo(name, tuple(int(d) for d in reversed(ne)), ggml_type, offset))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT)) or DEFAULT_ALIGNMENT
    data_offset = -(-f.tell() // alignment) * alignment
    return GgufHeader(version, metadata, tuple(tensors), data_offset)


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
