"""Llama 3.1's ``rope_freqs`` tensor back to mlx-lm's ``llama3`` rope_scaling
(exo_p2p/models/gguf/rope.py): for any llama3 parameters, the recovered ones give mlx-lm's
``Llama3RoPE`` the frequencies llama.cpp runs with (factors as its converter writes them)."""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.gguf.rope import llama3_scaling, rope_scaling_from_metadata
from tests.support.models.gguf_files import llama3_rope_freqs


def _mlx_lm_periods(scaling: dict, base: float, dims: int) -> np.ndarray:
    from mlx_lm.models.rope_utils import Llama3RoPE

    return np.array(Llama3RoPE(dims, 131072, False, base, scaling)._freqs)


@settings(max_examples=60, deadline=None)
@given(factor=st.floats(2, 40), low=st.floats(0.5, 2), span=st.floats(0.5, 8),
       context=st.sampled_from([2048, 4096, 8192, 16384]), base=st.sampled_from([10000.0, 500000.0]),
       dims=st.sampled_from([64, 128]))
def test_recovered_scaling_gives_llama_cpp_frequencies(factor, low, span, context, base, dims) -> None:
    original = {"factor": factor, "low_freq_factor": low, "high_freq_factor": low + span,
                "original_max_position_embeddings": context}
    factors = llama3_rope_freqs(original, base, dims)
    assume(np.all(np.isfinite(factors)))
    recovered = llama3_scaling(factors, base, dims)
    periods = base ** (np.arange(0, dims, 2) / dims)  # llama.cpp: theta / factor = pos / (period · factor)
    np.testing.assert_allclose(_mlx_lm_periods(recovered, base, dims), periods * factors, rtol=1e-4)


def test_llama_3_1_values_come_back() -> None:
    original = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
    got = llama3_scaling(llama3_rope_freqs(original, 500000.0, 128), 500000.0, 128)
    assert got == {"rope_type": "llama3", **original}


def test_other_factor_vectors_are_refused() -> None:
    with pytest.raises(UnsupportedModelError, match="does not match Llama 3"):
        llama3_scaling(np.linspace(1, 3, 32) ** 2, 10000.0, 64)
    with pytest.raises(UnsupportedModelError, match="shape"):
        llama3_scaling(np.ones(10), 10000.0, 64)


def test_metadata_scaling_kinds() -> None:
    assert rope_scaling_from_metadata({}, "qwen2") is None
    assert rope_scaling_from_metadata({"qwen2.rope.scaling.type": "linear", "qwen2.rope.scaling.factor": 4.0},
                                      "qwen2") == {"type": "linear", "factor": 4.0}
    assert rope_scaling_from_metadata({"qwen2.rope.scaling.type": "yarn", "qwen2.rope.scaling.factor": 4.0,
                                       "qwen2.rope.scaling.original_context_length": 32768}, "qwen2") == {
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    with pytest.raises(UnsupportedModelError, match="'longrope'"):
        rope_scaling_from_metadata({"x.rope.scaling.type": "longrope"}, "x")
