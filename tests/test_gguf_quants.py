"""Every GGML type the importer reads, against the ``gguf`` package's reference
(``gguf.quants.dequantize``) on random blocks; MLX's packing; and what each type becomes in
the imported directory (exact MLX affine quantization or float16: exo_p2p/models/gguf/tensors.py)."""

from __future__ import annotations

import io
import json

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.gguf.quants import GGML_TYPES, affine_blocks, dequantize, pack_mlx
from exo_p2p.models.gguf.reader import GgufTensorInfo
from exo_p2p.models.gguf.tensors import plan_tensor, write_tensor
from tests.support.models.gguf_files import random_blocks

import gguf  # noqa: E402  (the test extra)
pytestmark = pytest.mark.unit


QUANTIZED = sorted(t for t, k in GGML_TYPES.items() if k.group is not None)
def reference(ggml_type: int, raw: np.ndarray) -> np.ndarray:
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(ggml_type))


@settings(max_examples=40, deadline=None)
@given(ggml_type=st.sampled_from(QUANTIZED), n_blocks=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_dequantize_equals_the_reference(ggml_type: int, n_blocks: int, seed: int) -> None:
    raw = random_blocks(ggml_type, n_blocks, seed)
    ours = dequantize(ggml_type, raw.reshape(1, -1))
    expected = reference(ggml_type, raw.reshape(1, -1))
    assert ours.shape == expected.shape == (1, n_blocks * GGML_TYPES[ggml_type].block)
    # the same numbers; float32 rounding of d·sc·q may differ by an ulp with the order of ops
    np.testing.assert_allclose(ours, expected, rtol=2**-22, atol=2**-30)


@settings(max_examples=30, deadline=None)
@given(ggml_type=st.sampled_from(QUANTIZED), seed=st.integers(0, 2**32 - 1))
def test_affine_form_is_exact_in_float64(ggml_type: int, seed: int) -> None:
    """scale × q + bias, each taken as stored (float32) and evaluated in float64, is the
    reference value (itself float32-rounded): the affine form loses nothing."""
    kind = GGML_TYPES[ggml_type]
    raw = random_blocks(ggml_type, 3, seed)
    q, scales, biases = affine_blocks(ggml_type, raw)
    assert q.dtype == np.uint8 and int(q.max()) < 2**kind.bits
    assert scales.shape == biases.shape == (3, kind.block // kind.group)
    groups = q.reshape(3, -1, kind.group).astype(np.float64)
    exact = (groups * scales[:, :, None].astype(np.float64) + biases[:, :, None]).reshape(1, -1)
    np.testing.assert_allclose(exact, reference(ggml_type, raw.reshape(1, -1)), rtol=2**-23, atol=0)


@pytest.mark.parametrize("name", ["F32", "F16", "BF16"])
def test_float_types_equal_the_reference(name: str) -> None:
    ggml_type = next(t for t, k in GGML_TYPES.items() if k.name == name)
    values = np.random.default_rng(1).normal(size=(3, 64)).astype(np.float32)
    raw = gguf.quants.quantize(values, gguf.GGMLQuantizationType(ggml_type))
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(3, -1)
    np.testing.assert_array_equal(dequantize(ggml_type, raw), reference(ggml_type, raw).reshape(3, -1))


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_pack_mlx_is_what_mlx_dequantizes(bits: int) -> None:
    q = np.random.default_rng(bits).integers(0, 2**bits, (4, 128), dtype=np.uint8)
    packed = pack_mlx(q, bits)
    assert packed.dtype == np.uint32 and packed.shape == (4, 128 * bits // 32)
    ones, zeros = mx.ones((4, 4)), mx.zeros((4, 4))
    back = mx.dequantize(mx.array(packed), scales=ones, biases=zeros, group_size=32, bits=bits)
    np.testing.assert_array_equal(np.array(back), q.astype(np.float32))


def _converted(ggml_type: int, rows: int, cols: int, seed: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The tensors the importer writes for a random ``[rows, cols]`` weight of
    ``ggml_type`` (as MLX reads them), and the reference values."""
    kind = GGML_TYPES[ggml_type]
    raw = random_blocks(ggml_type, rows * cols // kind.block, seed, scale=0.01).reshape(rows, -1)
    plan = plan_tensor(GgufTensorInfo("blk.0.attn_q.weight", (rows, cols), ggml_type), "x.weight")
    out = io.BytesIO()
    write_tensor(plan, raw, out)
    data, arrays, offset = out.getvalue(), {}, 0
    for t in plan.outputs:
        dtype = {"U32": np.uint32, "F16": np.float16, "F32": np.float32}[t.dtype]
        arrays[t.name] = np.frombuffer(data[offset:offset + t.nbytes], dtype).reshape(t.shape)
        offset += t.nbytes
    assert offset == len(data)
    return arrays, reference(ggml_type, raw)


@pytest.mark.parametrize("ggml_type", QUANTIZED, ids=lambda t: GGML_TYPES[t].name)
def test_imported_tensor_is_exact_or_float16(ggml_type: int) -> None:
    """Q4_0 … Q5_K: MLX affine quantization (group 32, same bits) whose dequantization is
    the reference exactly (up to float32 rounding); Q2_K, Q3_K, Q6_K: float16 within its
    rounding. A bug in the layout of any type moves values by whole quantization steps."""
    kind = GGML_TYPES[ggml_type]
    arrays, expected = _converted(ggml_type, 8, 512, seed=ggml_type)
    if kind.name in ("Q2_K", "Q3_K", "Q6_K"):
        assert set(arrays) == {"x.weight"} and arrays["x.weight"].dtype == np.float16
        np.testing.assert_allclose(arrays["x.weight"].astype(np.float32), expected, rtol=2**-11, atol=2**-24)
        return
    assert set(arrays) == {"x.weight", "x.scales", "x.biases"}
    assert arrays["x.scales"].dtype == (np.float32 if kind.name.endswith("_K") else np.float16)
    # in float32 (with float16 scales mx.dequantize would compute in float16)
    back = mx.dequantize(mx.array(arrays["x.weight"]), scales=mx.array(arrays["x.scales"].astype(np.float32)),
                         biases=mx.array(arrays["x.biases"].astype(np.float32)), group_size=32,
                         bits=kind.bits)
    np.testing.assert_allclose(np.array(back), expected, rtol=2**-22, atol=2**-30)


def test_unknown_tensor_type_is_named() -> None:
    info = GgufTensorInfo("blk.0.attn_q.weight", (4, 256), 16)  # IQ2_XXS
    with pytest.raises(UnsupportedModelError, match="IQ2_XXS"):
        plan_tensor(info, "x.weight")
    with pytest.raises(UnsupportedModelError, match="type 99"):
        plan_tensor(GgufTensorInfo("t", (4, 256), 99), "x.weight")


def test_safetensors_header_lists_outputs_in_order() -> None:
    from exo_p2p.models.gguf.tensors import safetensors_header

    plan = plan_tensor(GgufTensorInfo("w", (4, 64), 2), "a.weight")  # Q4_0
    blob = safetensors_header(plan.outputs)
    length = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + length])
    assert length % 8 == 0 and header["__metadata__"] == {"format": "mlx"}
    assert header["a.weight"] == {"dtype": "U32", "shape": [4, 8], "data_offsets": [0, 128]}
    assert header["a.scales"]["data_offsets"] == [128, 144]
