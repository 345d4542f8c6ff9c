"""Pure rules mapping a GGUF onto the MLX/Hugging Face layout mlx-lm loads: tensor names,
``config.json`` from the GGUF metadata, the ``"quantization"`` entry, and the plan of every
tensor (:func:`model_plan`, shared by the importer and the card so both agree on every
byte). The architectures and their rules: :mod:`exo_p2p.models.gguf.arch`; the tensor types:
:mod:`exo_p2p.models.gguf.tensors`.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Callable, Mapping

import numpy as np

from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.gguf.arch import ARCHITECTURES, ArchSpec, arch_spec, base_config
from exo_p2p.models.gguf.reader import GgufHeader, GgufTensorInfo
from exo_p2p.models.gguf.tensors import TensorPlan, plan_tensor
from exo_p2p.models.gguf.tokenizer import check_tokenizer

SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)
"""``general.architecture`` values the importer handles (Mistral GGUFs also say llama)."""

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_SUFFIXES = ("weight", "bias")
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.([a-z]+)$")
_GLOBAL_RE = re.compile(r"^([a-z_]+)\.([a-z]+)$")


def hf_tensor_name(gguf_name: str, spec: ArchSpec = ARCHITECTURES["llama"]) -> str:
    """The Hugging Face / mlx-lm name of a GGUF tensor of architecture ``spec``.

    ``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``,
    ``token_embd.weight`` -> ``model.embed_tokens.weight``, ``output.weight`` -> ``lm_head.weight``.

    Raises:
        UnsupportedModelError: a tensor outside the architecture's layout (e.g. MoE experts).
    """
    if m := _BLOCK_RE.match(gguf_name):
        layer, part, suffix = m.groups()
        if part in spec.block_names and suffix in _SUFFIXES:
            return f"model.layers.{layer}.{spec.block_names[part]}.{suffix}"
    elif m := _GLOBAL_RE.match(gguf_name):
        part, suffix = m.groups()
        if part in _GLOBAL_NAMES and suffix in _SUFFIXES:
            return f"{_GLOBAL_NAMES[part]}.{suffix}"
    raise UnsupportedModelError(
        f"GGUF tensor {gguf_name!r} has no place in the {spec.model_type} layout this "
        "importer supports")


def _no_tensor_reads(name: str) -> np.ndarray:
    raise UnsupportedModelError(f"reading GGUF tensor {name!r} needs the file")


def config_from_gguf(metadata: Mapping[str, Any], tensors: tuple[GgufTensorInfo, ...],
                     read_tensor: Callable[[str], np.ndarray] = _no_tensor_reads) -> dict:
    """The mlx-lm ``config.json`` (without ``"quantization"``) of a GGUF: the shared sizes
    (:func:`exo_p2p.models.gguf.arch.base_config`) and the architecture's own keys.
    ``read_tensor`` reads the small tensors some configs hold (rope factors).

    Raises:
        UnsupportedModelError: another architecture, missing sizes, or unsupported rope
            settings (each named).
    """
    arch, spec = arch_spec(metadata)
    names = frozenset(t.name for t in tensors)
    config = base_config(metadata, arch, names)
    config.update({"model_type": spec.model_type, **spec.extra_config(metadata, config, names, read_tensor)})
    return config


def model_plan(header: GgufHeader, read_tensor: Callable[[str], np.ndarray] = _no_tensor_reads,
               ) -> tuple[dict[str, Any], list[TensorPlan]]:
    """The imported directory of a GGUF, before any weight is read: its ``config.json``
    (with ``"quantization"`` when a tensor stays quantized) and the plan of every tensor
    (:func:`exo_p2p.models.gguf.tensors.plan_tensor`) in file order.

    Raises:
        UnsupportedModelError: as :func:`config_from_gguf` and :func:`hf_tensor_name`, a
            tensor type or tokenizer kind the importer does not read (each named).
    """
    config = config_from_gguf(header.metadata, header.tensors, read_tensor)
    check_tokenizer(header.metadata)
    _, spec = arch_spec(header.metadata)
    plans = []
    for info in header.tensors:
        if info.name in spec.consumed:
            continue
        name = hf_tensor_name(info.name, spec)
        minus_one = spec.norms_plus_one and name.endswith("norm.weight")
        plans.append(plan_tensor(info, name, minus_one=minus_one))
    shapes = {t.name: t.shape for p in plans for t in p.outputs}
    in_features = {p.outputs[0].name.removesuffix(".weight"): p.source.shape[-1]
                   for p in plans if p.mode == "quantized"}
    quantization = quantization_from_shapes(shapes, in_features)
    if quantization is not None:
        config["quantization"] = quantization
    return config, plans


def quantization_from_shapes(
    packed: Mapping[str, tuple[int, ...]], in_features: Mapping[str, int]
) -> dict[str, Any] | None:
    """The mlx-lm ``"quantization"`` entry for a set of weights.

    ``packed`` maps every tensor name to its stored shape; ``in_features[module]`` is the
    unpacked input size of each module that has ``.scales``. Per module, ``group_size =
    in_features / scales.shape[-1]`` and ``bits = weight.shape[-1] * 32 / in_features``
    (uint32 packing). The most common (group_size, bits) is the default; modules that differ
    get a per-module entry, and 2-D weights without scales get ``false`` (stay unquantized).
    Returns None when nothing is quantized.
    """
    params: dict[str, tuple[int, int]] = {}
    for module, n_in in in_features.items():
        groups = packed[f"{module}.scales"][-1]
        words = packed[f"{module}.weight"][-1]
        if n_in % groups or (words * 32) % n_in:
            raise UnsupportedModelError(f"cannot derive quantization of {module} from shapes")
        params[module] = (n_in // groups, words * 32 // n_in)
    if not params:
        return None
    (group_size, bits), _ = Counter(params.values()).most_common(1)[0]
    quantization: dict[str, Any] = {"group_size": group_size, "bits": bits}
    for module, (g, b) in sorted(params.items()):
        if (g, b) != (group_size, bits):
            quantization[module] = {"group_size": g, "bits": b}
    for name, shape in sorted(packed.items()):
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and len(shape) == 2 and module not in params:
            quantization[module] = False
    return quantization
