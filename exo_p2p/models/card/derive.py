"""Model cards (docs/architecture.md#vocabulary) derived from a model's files, never from a hard-coded list.

A card is computed from ``config.json`` and the safetensors *headers* (8-byte little-endian
header length, then a JSON header with each tensor's ``data_offsets``); weights are never
read. :func:`card_from_gguf` gives the card the same GGUF would have after
:func:`exo_p2p.models.gguf.importer.import_gguf`, from the GGUF header alone.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import re
import struct
from pathlib import Path
from typing import Any, Mapping

import msgspec

from exo_p2p.models.card.capabilities import model_capabilities, model_dir_template, template_capabilities
from exo_p2p.models.card.families import quantization_of
from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.gguf.layout import model_plan
from exo_p2p.models.gguf.reader import read_float_tensor, read_gguf_header
from exo_p2p.models.hub_limits import check_layers
from exo_p2p.models.model_json import model_json, model_json_file
from exo_p2p.models.card.tensor_parts import layer_pattern, tensor_parts
from exo_p2p.types.common import ModelId
from exo_p2p.types.kinds import context_tokens, model_kind, model_tasks
from exo_p2p.types.models import ModelCard

DEFAULT_CONTEXT_LENGTH = 4096
"""Context length in tokens assumed when ``config.json`` has no ``max_position_embeddings``."""

WEIGHT_GLOB = "model*.safetensors"
"""The weight files mlx-lm's ``load_model`` reads; the card counts the same files."""



def read_safetensors_sizes(path: Path) -> dict[str, int]:
    """Tensor name -> bytes on disk, from the header of one ``.safetensors`` file.

    Raises:
        UnsupportedModelError: the header is truncated or not valid JSON.
    """
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise UnsupportedModelError(f"{path}: truncated safetensors header")
        (length,) = struct.unpack("<Q", raw)
        data = f.read(length)
    if len(data) != length:
        raise UnsupportedModelError(f"{path}: truncated safetensors header")
    header = model_json(data, f"{path}: safetensors header")
    return {name: info["data_offsets"][1] - info["data_offsets"][0]
            for name, info in header.items() if name != "__metadata__"}


def read_safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, from the header of one ``.safetensors`` file (same errors as
    :func:`read_safetensors_sizes`)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise UnsupportedModelError(f"{path}: truncated safetensors header")
        (length,) = struct.unpack("<Q", raw)
        data = f.read(length)
    header = model_json(data, f"{path}: safetensors header")
    return {name: tuple(int(d) for d in info["shape"]) for name, info in header.items() if name != "__metadata__"}


def _quant_bits(config: Mapping[str, Any], module: str) -> int | None:
    """Bits of ``module``'s quantized weight from the config's ``quantization`` (a
    per-module override wins), None when the model is not quantized."""
    q = config.get("quantization") or config.get("quantization_config")
    if not isinstance(q, Mapping):
        return None
    override = q.get(module)
    if isinstance(override, Mapping) and override.get("bits"):
        return int(override["bits"])
    return int(q["bits"]) if q.get("bits") else None


def float32_sizes(config: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """Tensor name -> bytes once the model is expanded to float32 at load (a CPU node's
    float32 weights, ``worker.engine.loading.dequantize``): a quantized ``X.weight`` (it has an
    ``X.scales``) holds ``rows × packed_columns × 32 / bits`` elements of 4 bytes and its
    ``X.scales`` / ``X.biases`` disappear (0 bytes); every other tensor holds its elements
    in 4 bytes each. Pure: shapes from the safetensors header or the GGUF's MLX layout."""
    out: dict[str, int] = {}
    for name, shape in shapes.items():
        elements = 1
        for d in shape:
            elements *= d
        prefix, _, leaf = name.rpartition(".")
        quantized = f"{prefix}.scales" in shapes
        if quantized and leaf in ("scales", "biases"):
            out[name] = 0
        elif quantized and leaf == "weight":
            bits = _quant_bits(config, prefix) or 4
            out[name] = elements * 32 // bits * 4
        else:
            out[name] = elements * 4
    return out


def card_from_model_dir(model_dir: Path, model_id: str) -> ModelCard:
    """The card of an MLX-format model directory (``config.json`` + ``model*.safetensors``).

    ``context_length`` is ``max_position_embeddings`` (less the two positions of the RoBERTa
    families, ``exo_p2p.types.kinds.context_tokens``), or :data:`DEFAULT_CONTEXT_LENGTH`
    (4096 tokens) when the config has none.

    Raises:
        UnsupportedModelError: no ``config.json`` or no weight files, or the tensors do not
            match the config's layer count.
    """
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise UnsupportedModelError(f"{model_dir}: no config.json")
    config = model_json_file(config_path, f"{model_dir}: config.json")
    weight_files = sorted(model_dir.glob(WEIGHT_GLOB))
    if not weight_files:
        raise UnsupportedModelError(f"{model_dir}: no {WEIGHT_GLOB} files")
    sizes: dict[str, int] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for path in weight_files:
        sizes.update(read_safetensors_sizes(path))
        shapes.update(read_safetensors_shapes(path))
    card = card_from_config(config, sizes, model_id, float32=float32_sizes(config, shapes))
    if "generate" not in card.tasks:  # an embedding model has no chat template to speak of
        return card
    return msgspec.structs.replace(card, capabilities=model_capabilities(model_dir_template(model_dir), config))


def card_from_gguf(gguf_path: Path, model_id: str) -> ModelCard:
    """The card :func:`card_from_model_dir` gives after importing ``gguf_path``, computed
    from the GGUF header only (tens of milliseconds, no weights read).

    Raises:
        UnsupportedModelError: as :func:`exo_p2p.models.gguf.importer.import_gguf`.
    """
    header = read_gguf_header(gguf_path)
    config, plans = model_plan(header, functools.partial(read_float_tensor, gguf_path, header))
    tensors = [t for plan in plans for t in plan.outputs]
    card = card_from_config(config, {t.name: t.nbytes for t in tensors}, model_id,
                            float32=float32_sizes(config, {t.name: t.shape for t in tensors}))
    template = header.metadata.get("tokenizer.chat_template")
    return msgspec.structs.replace(card, capabilities=template_capabilities(template if isinstance(template, str) else None))


#: bytes per element of a config's ``torch_dtype`` (the activations' dtype in mlx-lm)
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _group_size(config: Mapping[str, Any]) -> int | None:
    """The layers' quantization group size from an mlx-lm config (``quantization`` or
    ``quantization_config``), None when not quantized."""
    q = config.get("quantization") or config.get("quantization_config")
    if isinstance(q, Mapping) and q.get("group_size"):
        return int(q["group_size"])
    return None


def card_from_config(
    config: Mapping[str, Any], sizes: Mapping[str, int], model_id: str,
    float32: Mapping[str, int] | None = None,
) -> ModelCard:
    """The card of a model given its mlx-lm config and tensor name -> bytes (pure).

    Tensors named ``….layers.{i}.…`` count for layer ``i`` (weights, ``.scales``,
    ``.biases``); ``….embed_tokens.…`` for the embedding; ``lm_head.…`` for the head; every
    other tensor (the final norm) for ``norm_bytes``, so the parts sum to ``storage_size``.
    ``head_dim`` comes from the config when it states one (else None: hidden ÷ heads), and
    ``activation_dtype_bytes`` from ``torch_dtype`` (None when absent). ``float32`` (tensor
    name -> bytes once expanded, :func:`float32_sizes`) gives the card's ``float32_*``
    sizes, split the same way (None: the card cannot say, and no node expands it).

    Raises:
        UnsupportedModelError: ``num_hidden_layers`` beyond the layers the tensors name or
            ``hub_limits.MAX_LAYERS`` (checked before anything is sized by it), a layer index
            outside it, or a layer with no tensors.
    """
    args = {**config.get("text_config", {}), **config}
    encoder = model_kind(config) == "encoder"  # embedding models: their own tensor names (exo_p2p.types.kinds)
    layer_re = layer_pattern(encoder)
    n_layers = check_layers(args["num_hidden_layers"], (int(m.group(1)) for n in sizes if (m := layer_re.search(n))))
    layer_bytes, embedding, head, norm = tensor_parts(sizes, n_layers, encoder)
    f32_layers, f32_embedding, f32_head, f32_norm = tensor_parts(float32, n_layers, encoder) if float32 else ([], 0, 0, 0)
    if empty := [i for i, b in enumerate(layer_bytes) if b == 0]:
        raise UnsupportedModelError(f"layers {empty[:5]} have no tensors")
    heads = args.get("num_attention_heads")
    kv_heads = args.get("num_key_value_heads", heads)
    model_type = str(args.get("model_type", "unknown"))
    head_dim = args.get("head_dim")
    dtype_bytes = _DTYPE_BYTES.get(str(args.get("torch_dtype", "")))
    return ModelCard(
        model_id=ModelId(model_id),
        n_layers=n_layers,
        hidden_size=int(args["hidden_size"]),
        num_attention_heads=int(heads or 0),
        num_key_value_heads=int(kv_heads or 0),
        vocab_size=int(args["vocab_size"]),
        context_length=context_tokens(args, DEFAULT_CONTEXT_LENGTH),
        storage_size=sum(sizes.values()),
        layer_bytes=tuple(layer_bytes),
        embedding_bytes=embedding,
        head_bytes=head,
        norm_bytes=norm,
        tie_word_embeddings=bool(args.get("tie_word_embeddings", head == 0)),
        architecture=model_type,
        supports_tensor=not encoder and bool(heads) and bool(kv_heads) and has_shard_method(model_type),
        head_dim=int(head_dim) if head_dim else None,
        activation_dtype_bytes=dtype_bytes,
        intermediate_size=int(args["intermediate_size"]) if args.get("intermediate_size") else None,
        quant_group_size=_group_size(config),
        float32_layer_bytes=tuple(f32_layers),
        float32_embedding_bytes=f32_embedding,
        float32_head_bytes=f32_head,
        float32_norm_bytes=f32_norm,
        quantization=quantization_of(config),
        tasks=model_tasks(config),
    )


@functools.lru_cache(maxsize=None)
def has_shard_method(model_type: str) -> bool:
    """Whether mlx-lm's module for ``model_type`` (after mlx-lm's own remapping, e.g.
    mistral -> llama) defines ``Model.shard`` (tensor parallelism).

    Read from mlx-lm's source when it answers plainly (``shard_method_in_source``): importing
    mlx-lm costs ~2 s of CPU (transformers with it), and a node cards its models at start,
    before its profile can be indexed (a restarted node rejoined that much later)."""
    plain = shard_method_in_source(model_type)
    if plain is not None:
        return plain
    try:
        from mlx_lm.utils import _get_classes  # lazy: imports MLX (seconds)

        model_class, _ = _get_classes({"model_type": model_type})
    except (ImportError, ValueError):
        try:
            model_class = importlib.import_module(f"mlx_lm.models.{model_type}").Model
        except (ImportError, AttributeError):
            return False
    return callable(getattr(model_class, "shard", None))


def shard_method_in_source(model_type: str) -> bool | None:
    """``has_shard_method`` from mlx-lm's source files, without importing mlx-lm: the model
    type remapped by ``MODEL_REMAPPING`` (a dict literal in ``mlx_lm/utils.py``), then whether
    class ``Model`` of ``mlx_lm/models/<type>.py``, a direct ``nn.Module`` subclass, defines
    ``shard``. None when the source does not say it plainly (no such file, another base class
    that may bring ``shard``, a remapping that is not a literal): then mlx-lm is imported."""
    try:
        spec = importlib.util.find_spec("mlx_lm")  # a top-level package: not imported
        if spec is None or not spec.submodule_search_locations:
            return None
        root = Path(next(iter(spec.submodule_search_locations)))
        remap: dict[str, str] | None = None
        for node in ast.parse((root / "utils.py").read_text()).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "MODEL_REMAPPING" for t in node.targets):
                remap = ast.literal_eval(node.value)
        if not isinstance(remap, dict) or not re.fullmatch(r"[A-Za-z0-9_]+", model_type):
            return None
        path = root / "models" / f"{remap.get(model_type, model_type)}.py"
        if not path.is_file():
            return None
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name == "Model":
                if [ast.unparse(b) for b in node.bases] != ["nn.Module"]:
                    return None
                return any(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) and b.name == "shard" for b in node.body)
    except (OSError, SyntaxError, ValueError, StopIteration):
        return None
    return None
