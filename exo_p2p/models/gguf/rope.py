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


def llama3_scaling(factors: np.ndarray, base: float, dims: int) -> dict[str, Any] | None:
    """mlx-lm's ``rope_scaling`` (type ``llama3``) whose factors equal ``factors`` (the
    ``rope_freqs`` tensor, ``[dims // 2]``) for rope base ``base`` and ``dims`` rotated dims;
    None when every factor is 1.

    The smooth part is ``1/f = (1 - s)/factor + s`` with ``s = a/wavelen + b`` linear in
    ``1/wavelen``, so ``original_max_position_embeddings`` can be :data:`ORIGINAL_CONTEXT`
    and ``low_freq_factor``/``high_freq_factor`` follow from ``a`` and ``b`` (fitted on the
    smooth pairs). With one smooth pair, the high-frequency bound is put halfway (in log) to
    the unscaled pair below it; with none, both bounds go in the gap between the unscaled
    and the scaled pairs.

    Raises:
        UnsupportedModelError: the factors are not of that form.
    """
    f = np.asarray(factors, dtype=np.float64).reshape(-1)
    if f.shape != (dims // 2,) or not np.all(np.isfinite(f)) or f.min() <= 0:
        raise UnsupportedModelError(f"GGUF rope_freqs has shape {factors.shape}, not ({dims // 2},)")
    if np.allclose(f, 1.0, rtol=1e-6):
        return None
    factor = float(f.max())
    wavelen = 2 * math.pi * base ** (np.arange(0, dims, 2) / dims)
    one, full = np.isclose(f, 1.0, rtol=1e-6), np.isclose(f, factor, rtol=1e-6)
    middle = ~one & ~full
    context = float(ORIGINAL_CONTEXT)
    below = wavelen[one].max() if one.any() else wavelen.min() / 2  # last unscaled pair
    above = wavelen[full].min() if full.any() else wavelen.max() * 2  # first scaled pair
    smooth = (1 / f[middle] - 1 / factor) / (1 - 1 / factor)
    candidates: list[tuple[float, float]] = []  # (low_freq_factor, high_freq_factor)
    if middle.sum() >= 2:
        a, b = np.polyfit(1 / wavelen[middle], smooth, 1)
        if a > 0:
            candidates.append((-b * context / a, -b * context / a + context / a))
    elif middle.sum() == 1:
        at, s0 = context / float(wavelen[middle][0]), float(smooth[0])
        high = context / math.sqrt(below * float(wavelen[middle][0]))  # bound below the pair
        candidates.append(((at - s0 * high) / (1 - s0), high))
        low = context / math.sqrt(above * float(wavelen[middle][0]))  # bound above the pair
        candidates.append((low, low + (at - low) / s0))
    else:
        candidates.append((context / (below ** (1 / 3) * above ** (2 / 3)),
                           context / (below ** (2 / 3) * above ** (1 / 3))))
    ok = False
    for low, high in candidates:
        exact = {"factor": factor, "low_freq_factor": float(low), "high_freq_factor": float(high),
                 "original_max_position_embeddings": context}
        for params in ({k: round(v, 6) for k, v in exact.items()}, exact):  # 0.9999999981 -> 1.0
            ok = (0 < params["low_freq_factor"] < params["high_freq_factor"]
                  and np.allclose(llama3_factors(params, base, dims), f, rtol=1e-5))
            if ok:
                break
        if ok:
            break
    if not ok:
        raise UnsupportedModelError(
            "GGUF rope_freqs does not match Llama 3's rope scaling (factor, low and high "
            "frequency factors); it is not supported")
    params["original_max_position_embeddings"] = ORIGINAL_CONTEXT
    return {"rope_type": "llama3", **params}


def as_float(value: Any) -> float:
    """A float32 metadata value as its shortest decimal (9.99999974e-06 -> 1e-05)."""
    return float(str(np.float32(value)))
