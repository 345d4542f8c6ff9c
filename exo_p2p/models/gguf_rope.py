"""Rope settings of a GGUF as mlx-lm's ``rope_scaling`` (pure functions).

- ``<arch>.rope.scaling.type`` ``linear`` -> ``{"type": "linear", "factor": f}``; ``yarn`` ->
  ``{"type": "yarn", "factor": f, "original_max_position_embeddings": n}``.
- Llama 3.1/3.2 GGUFs carry no scaling metadata but a ``rope_freqs.weight`` tensor: one
  factor per rotated pair, made by llama.cpp's converter from the Hugging Face
  ``rope_scaling`` of type ``llama3`` (``factor``, ``low_freq_factor``, ``high_freq_factor``,
  ``original_max_position_embeddings``). :func:`llama3_scaling` finds parameters that give
  the same factors (within 1e-5 relative) with mlx-lm's ``Llama3RoPE`` formula; a vector of
  another shape is an error, never an approximation.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from exo_p2p.models.errors import UnsupportedModelError

ORIGINAL_CONTEXT = 8192
"""The ``original_max_position_embeddings`` written for a Llama 3 rope found from its
factors (tokens; Llama 3.1's own): any value with the same slope and intercept of the
smooth part gives the same factors, so the choice only fixes the other two."""


def rope_scaling_from_metadata(metadata: Mapping[str, Any], arch: str) -> dict | None:
    """mlx-lm's ``rope_scaling`` from ``<arch>.rope.scaling.*`` (None: no scaling).

    Raises:
        UnsupportedModelError: a scaling type other than none, linear or yarn.
    """
    kind = metadata.get(f"{arch}.rope.scaling.type", "none")
    factor = metadata.get(f"{arch}.rope.scaling.factor")
    if kind == "none" or (kind == "linear" and factor in (None, 1.0)):
        return None
    if kind == "linear":
        return {"type": "linear", "factor": as_float(factor)}
    if kind == "yarn":
        scaling: dict[str, Any] = {"type": "yarn", "factor": as_float(factor)}
        if (original := metadata.get(f"{arch}.rope.scaling.original_context_length")) is not None:
            scaling["original_max_position_embeddings"] = int(original)
        return scaling
    raise UnsupportedModelError(
        f"GGUF rope scaling {kind!r} is not supported (supported: none, linear, yarn, "
        "and Llama 3's rope_freqs)")


def llama3_factors(params: Mapping[str, float], base: float, dims: int) -> np.ndarray:
    """The per-pair factors llama.cpp's converter writes as ``rope_freqs`` for a ``llama3``
    ``rope_scaling`` (``factor``, ``low_freq_factor``, ``high_freq_factor``,
    ``original_max_position_embeddings``), float64 ``[dims // 2]``."""
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    context = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi * base ** (np.arange(0, dims, 2) / dims)
    smooth = (context / wavelen - low) / (high - low)
    middle = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < context / high, 1.0, np.where(wavelen > context / low, factor, middle))


def llama3_scaling(factors: np.ndarray, base: float, dims: int) -> dict[str, Any]:
    """mlx-lm's ``rope_scaling`` (type ``llama3``) whose factors equal ``factors`` (the
    ``rope_freqs`` tensor, ``[dims // 2]``) for rope base ``base`` and ``dims`` rotated dims.

    The smooth part is ``1/f = (1 - s)/factor + s`` with ``s = a/wavelen + b`` linear in
    ``1/wavelen``: ``a`` and ``b`` (fitted on the smooth pairs) fix ``low_freq_factor`` and
    ``high_freq_factor`` once ``original_max_position_embeddings`` is :data:`ORIGINAL_CONTEXT`.
    With fewer than two smooth pairs, 1 and 4 (Llama 3.1's) are used.

    Raises:
        UnsupportedModelError: the factors are not of that form.
    """
    f = np.asarray(factors, dtype=np.float64).reshape(-1)
    if f.shape != (dims // 2,) or not np.all(np.isfinite(f)) or f.min() <= 0:
        raise UnsupportedModelError(f"GGUF rope_freqs has shape {factors.shape}, not ({dims // 2},)")
    factor = float(f.max())
    inv_wavelen = 1 / (2 * math.pi * base ** (np.arange(0, dims, 2) / dims))
    middle = ~np.isclose(f, 1.0, rtol=1e-6) & ~np.isclose(f, factor, rtol=1e-6)
    context = float(ORIGINAL_CONTEXT)
    if factor > 1 and middle.sum() >= 2:
        smooth = (1 / f[middle] - 1 / factor) / (1 - 1 / factor)
        a, b = np.polyfit(inv_wavelen[middle], smooth, 1)
        low = -b * context / a if a > 0 else 0.0
        high = low + context / a if a > 0 else 0.0
    else:
        low, high = 1.0, 4.0
        if factor > 1 and middle.sum() == 1:  # s = (context/wavelen - 1) / 3 at that pair
            s = (1 / f[middle][0] - 1 / factor) / (1 - 1 / factor)
            context = (3 * s + 1) / float(inv_wavelen[middle][0])
        elif factor > 1:  # a context between the last unscaled and the first scaled pair
            unscaled = 1 / inv_wavelen[np.isclose(f, 1.0, rtol=1e-6)]
            scaled = 1 / inv_wavelen[np.isclose(f, factor, rtol=1e-6)]
            if unscaled.size and scaled.size:
                context = math.sqrt(4 * unscaled.max() * scaled.min())
    params = {"factor": factor, "low_freq_factor": float(low), "high_freq_factor": float(high),
              "original_max_position_embeddings": float(context)}
    rounded = {k: round(v, 6) for k, v in params.items()}  # 0.9999999981 -> 1.0
    if np.allclose(llama3_factors(rounded, base, dims), f, rtol=1e-5):
        params = rounded
    factor, low, high, context = (params[k] for k in (
        "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"))
    ok = low > 0 and high > low and np.allclose(llama3_factors(params, base, dims), f, rtol=1e-5)
    if not ok:
        raise UnsupportedModelError(
            "GGUF rope_freqs does not match Llama 3's rope scaling (factor, low and high "
            "frequency factors); it is not supported")
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": float(low),
            "high_freq_factor": float(high),
            "original_max_position_embeddings": round(context) if context == round(context) else context}


def as_float(value: Any) -> float:
    """A float32 metadata value as its shortest decimal (9.99999974e-06 -> 1e-05)."""
    return float(str(np.float32(value)))
