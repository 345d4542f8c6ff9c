"""Which ways each model family can be split, and why not (docs/models.md#families).

A pure rule read by placement (``master.placement.place``: a split a family cannot take is refused
there, with this reason in the previews, never at load) and by the model listing
(``exo-p2p models``: ``family``, ``quantization``, ``shardings``). A family is config.json's
``model_type`` (the card's ``architecture``).

``MATRIX`` holds what tests/test_family_matrix.py proves with tiny random models of each
family in real rank processes (1 rank, a 2-rank pipeline, 2-rank tensor parallel: the same
greedy tokens and first-step log-probabilities as one rank, batches equal to solo requests,
each rank holding its share). ``NO_PIPELINE`` names families whose layers pass more than
hidden states to later layers (a pipeline rank has only the hidden states it receives:
``worker.engine.layer_span``). Any other family is untested: a pipeline is allowed (it runs
the family's own forward), tensor parallel when mlx-lm has ``Model.shard`` for it (the
card's ``supports_tensor``) — both noted as untested.

Tensor parallelism also needs the heads and widths to divide by the world size
(``master.placement.split.tensor_divisibility_problem``), checked per size by placement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SHARDINGS = ("pipeline", "tensor")
"""The ways to split a model over several nodes (one node needs neither)."""

UNTESTED = "untested for this family"
"""The note on a sharding allowed for a family outside ``MATRIX``."""

NO_MLX_SHARD = "mlx-lm has no tensor sharding (Model.shard) for this family"


@dataclass(frozen=True)
class FamilySupport:
    """Why ``pipeline`` / ``tensor`` cannot split a family (None: it can, proven)."""

    pipeline: str | None = None
    tensor: str | None = None


MATRIX: dict[str, FamilySupport] = {
    "llama": FamilySupport(),
    "mistral": FamilySupport(),
    "qwen2": FamilySupport(),
    "qwen3": FamilySupport(),
    "qwen3_moe": FamilySupport(),
    "gemma3_text": FamilySupport(tensor=NO_MLX_SHARD),
    "phi3": FamilySupport(tensor=NO_MLX_SHARD),
    "gpt_oss": FamilySupport(),
    "deepseek_v3": FamilySupport(),
    "glm4_moe": FamilySupport(),
}
"""Family → what tests/test_family_matrix.py shows (docs/models.md#families)."""

NO_PIPELINE: dict[str, str] = {
    "gemma3n": "its later layers reuse earlier layers' KV caches and per-layer inputs",
    "gemma4_text": "its later layers may reuse earlier layers' KV caches",
    "afm7": "its last layers reuse earlier layers' KV caches",
    "iquestloopcoder": "it runs its layers twice, the second loop reading the first loop's caches",
}
"""Families whose layers pass more than hidden states on: not split into layer ranges."""


def sharding_problem(family: str, sharding: str, *, supports_tensor: bool = True) -> str | None:
    """Why ``family`` cannot be split by ``sharding`` over 2 or more nodes, or None when it
    can (whatever the nodes; divisibility by the world size is placement's). ``supports_tensor``:
    the card's (mlx-lm has ``Model.shard`` for the family). Raises ``ValueError`` for an
    unknown sharding."""
    if sharding not in SHARDINGS:
        raise ValueError(f"unknown sharding {sharding!r}; use pipeline or tensor")
    if sharding == "pipeline" and family in NO_PIPELINE:
        return f"pipeline: {family} layers cannot be split into ranges ({NO_PIPELINE[family]})"
    known = MATRIX.get(family)
    reason = getattr(known, sharding) if known is not None else None
    if reason is None and sharding == "tensor" and not supports_tensor:
        reason = NO_MLX_SHARD
    return None if reason is None else f"{sharding}: {family} cannot be split so ({reason})"


def shardings_of(family: str, *, supports_tensor: bool = True) -> tuple[list[str], dict[str, str]]:
    """The shardings ``family`` allows over several nodes, and a note per sharding: why not,
    or ``UNTESTED`` for an allowed one outside ``MATRIX``."""
    allowed: list[str] = []
    notes: dict[str, str] = {}
    for sharding in SHARDINGS:
        problem = sharding_problem(family, sharding, supports_tensor=supports_tensor)
        if problem is None:
            allowed.append(sharding)
            if family not in MATRIX:
                notes[sharding] = UNTESTED
        else:
            notes[sharding] = problem
    return allowed, notes


def quantization_of(config: Mapping[str, Any]) -> str:
    """How a model's weights are stored, from its mlx-lm config: ``"4-bit, group 32"`` (affine
    quantization; ``", some modules 8-bit"`` when per-module overrides differ), else the
    config's ``torch_dtype`` (``"bfloat16"``...), else ``"unquantized"``."""
    q = config.get("quantization") or config.get("quantization_config")
    if isinstance(q, Mapping) and q.get("bits"):
        bits = int(q["bits"])
        text = f"{bits}-bit" + (f", group {int(q['group_size'])}" if q.get("group_size") else "")
        others = sorted({int(v["bits"]) for v in q.values() if isinstance(v, Mapping) and v.get("bits")} - {bits})
        if others:
            text += ", some modules " + "/".join(f"{b}-bit" for b in others)
        return text
    dtype = config.get("torch_dtype") or (config.get("text_config") or {}).get("torch_dtype")
    return str(dtype) if dtype else "unquantized"
