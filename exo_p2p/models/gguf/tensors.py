"""How each GGUF tensor is stored in an imported MLX directory, and the streaming writer.

The rule per GGML type (docs/models.md#gguf; the affine form of each type:
:mod:`exo_p2p.models.gguf.quants`):

- ``F32``, ``F16``, ``BF16``: copied, same dtype.
- ``Q4_0``, ``Q4_1``, ``Q5_0``, ``Q5_1``, ``Q8_0``: MLX affine quantization, group 32, the same
  bits (4, 4, 5, 5, 8), float16 scales and biases: exact (the same numbers).
- ``Q4_K``, ``Q5_K``: MLX affine, group 32, 4 or 5 bits, **float32** scales and biases:
  exact (a float16 times a 6-bit integer needs up to 17 significant bits; float16 has 11).
- ``Q2_K``, ``Q3_K``, ``Q6_K``: their scales cover 16 elements, and MLX's affine groups are
  32, 64 or 128, so no MLX quantization holds them exactly: dequantized to **float16** (half
  of float32's bytes; the rounding, at most 2**-11 relative, is far below these types' own
  step; bfloat16 would round to 2**-8). A value beyond float16's range is an error.

A weight that is quantized becomes ``X.weight`` (uint32, packed by ``pack_mlx``),
``X.scales`` and ``X.biases``; only 2-D ``.weight`` tensors are kept quantized.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal, Sequence

import numpy as np

from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.gguf.quants import GGML_TYPES, affine_blocks, dequantize, pack_mlx
from exo_p2p.models.gguf.reader import GgufTensorInfo, unsupported_type

SCALE_DTYPE = {"Q4_0": "F16", "Q4_1": "F16", "Q5_0": "F16", "Q5_1": "F16", "Q8_0": "F16",
               "Q4_K": "F32", "Q5_K": "F32"}
"""GGML types kept quantized (exactly), and the dtype of their scales and biases."""

DEQUANTIZED_DTYPE = "F16"
"""What the other quantized types (Q2_K, Q3_K, Q6_K) are expanded to."""

CHUNK_ELEMENTS = 1 << 22
"""Elements converted at a time (about 4 M: tens of MB of temporaries, whatever the model)."""

_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2, "U32": 4}
_NUMPY = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "U32": np.dtype("<u4")}


@dataclass(frozen=True)
class OutTensor:
    """One tensor of the imported ``model.safetensors``: name, shape, safetensors dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        """Bytes of its data."""
        return math.prod(self.shape) * _ITEMSIZE[self.dtype]


@dataclass(frozen=True)
class TensorPlan:
    """How the GGUF tensor ``source`` becomes ``outputs`` (in file order).

    ``mode``: ``copy`` (a float type, same dtype), ``quantized`` (MLX affine: weight,
    scales, biases) or ``dequantized`` (float16). ``minus_one`` subtracts 1 from every value
    (Gemma's norms, stored by llama.cpp as 1 + w: docs/models.md#gguf); the result is float32.
    """

    source: GgufTensorInfo
    mode: Literal["copy", "quantized", "dequantized"]
    outputs: tuple[OutTensor, ...]
    minus_one: bool = False


def plan_tensor(info: GgufTensorInfo, name: str, *, minus_one: bool = False) -> TensorPlan:
    """The plan of GGUF tensor ``info`` stored as ``name`` (a Hugging Face name).

    Raises:
        UnsupportedModelError: a GGML type the importer does not read (named).
    """
    kind = GGML_TYPES.get(info.ggml_type)
    if kind is None:
        raise unsupported_type(info)
    shape = info.shape
    if minus_one:
        return TensorPlan(info, "dequantized", (OutTensor(name, shape, "F32"),), True)
    if kind.group is None:
        return TensorPlan(info, "copy", (OutTensor(name, shape, kind.name),))
    scale_dtype = SCALE_DTYPE.get(kind.name)
    if scale_dtype is None or len(shape) != 2 or not name.endswith(".weight"):
        return TensorPlan(info, "dequantized", (OutTensor(name, shape, DEQUANTIZED_DTYPE),))
    assert kind.bits is not None
    rows, cols = shape
    prefix = name.removesuffix(".weight")
    groups = (rows, cols // kind.group)
    return TensorPlan(info, "quantized", (
        OutTensor(name, (rows, cols * kind.bits // 32), "U32"),
        OutTensor(f"{prefix}.scales", groups, scale_dtype),
        OutTensor(f"{prefix}.biases", groups, scale_dtype),
    ))


def write_tensor(plan: TensorPlan, raw: np.ndarray, out: BinaryIO) -> None:
    """Write ``plan``'s outputs, in order, converted from ``raw`` (the GGUF tensor's bytes,
    uint8 ``[rows, row_bytes]``), :data:`CHUNK_ELEMENTS` at a time.

    Raises:
        UnsupportedModelError: a dequantized value beyond float16's range.
    """
    kind = GGML_TYPES[plan.source.ggml_type]
    cols = plan.source.shape[-1]
    rows = raw.shape[0]
    step = max(1, CHUNK_ELEMENTS // max(1, cols))
    if plan.mode == "copy":
        for start in range(0, rows, step):
            out.write(np.ascontiguousarray(raw[start:start + step]).tobytes())
        return
    if plan.mode == "dequantized":
        dtype = _NUMPY[plan.outputs[0].dtype]
        for start in range(0, rows, step):
            values = dequantize(plan.source.ggml_type, raw[start:start + step])
            if plan.minus_one:
                values = values - np.float32(1)
            converted = values.astype(dtype)
            if not np.isfinite(converted).all() and np.isfinite(values).all():
                raise UnsupportedModelError(
                    f"GGUF tensor {plan.source.name!r} has values beyond float16's range")
            out.write(converted.tobytes())
        return
    assert kind.bits is not None and kind.group is not None
    scale_dtype = _NUMPY[plan.outputs[1].dtype]
    scales = np.empty((rows, cols // kind.group), scale_dtype)
    biases = np.empty_like(scales)
    for start in range(0, rows, step):
        chunk = raw[start:start + step]
        n = chunk.shape[0]
        q, s, b = affine_blocks(plan.source.ggml_type, np.ascontiguousarray(chunk).reshape(-1, kind.nbytes))
        out.write(pack_mlx(q.reshape(n, cols), kind.bits).tobytes())
        scales[start:start + n] = s.reshape(n, -1)
        biases[start:start + n] = b.reshape(n, -1)
    out.write(scales.tobytes())
    out.write(biases.tobytes())


def safetensors_header(tensors: Sequence[OutTensor]) -> bytes:
    """The 8-byte length and JSON header of a safetensors file holding ``tensors`` in order
    (``__metadata__``: ``{"format": "mlx"}``), padded with spaces to a multiple of 8."""
    header: dict[str, object] = {"__metadata__": {"format": "mlx"}}
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape),
                          "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def write_safetensors(path: Path, gguf_path: Path, data_offset: int,
                      plans: Sequence[TensorPlan]) -> None:
    """Write ``model.safetensors`` at ``path`` from the GGUF at ``gguf_path`` (its data
    section at ``data_offset``), one tensor at a time: memory stays at one chunk's
    temporaries plus one tensor's scales, whatever the model's size.

    Raises:
        UnsupportedModelError: as :func:`write_tensor`; OSError: reading or writing.
        ValueError: a tensor's data lies beyond the end of the GGUF (a truncated file).
    """
    outputs = [t for plan in plans for t in plan.outputs]
    with open(path, "wb") as out:
        out.write(safetensors_header(outputs))
        start = out.tell()
        for plan in plans:
            info = plan.source
            rows = math.prod(info.shape[:-1]) if len(info.shape) > 1 else 1
            raw = np.memmap(gguf_path, np.uint8, "r", data_offset + info.offset,
                            (rows, info.nbytes // rows))
            write_tensor(plan, raw, out)
            del raw
        written = out.tell() - start
    if written != sum(t.nbytes for t in outputs):
        raise AssertionError(f"wrote {written} bytes of tensor data, planned {sum(t.nbytes for t in outputs)}")
