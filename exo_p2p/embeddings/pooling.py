"""How a model's final hidden states become one vector: its pooling, normalisation and the
dimensions it may be truncated to, read from the model's own files.

Where each rule comes from:
- sentence-transformers' ``modules.json`` names a ``Pooling`` module (its folder's
  ``config.json``: ``pooling_mode_cls_token`` / ``pooling_mode_mean_tokens`` /
  ``pooling_mode_lasttoken``) and a ``Normalize`` module when the vectors are unit length;
- without those files a causal LM pools its last token (the convention of decoder embedding
  models, Qwen3-Embedding, E5-Mistral) and an encoder the mean of its tokens (what
  ``mlx_embeddings`` gives as ``text_embeds``), both normalised;
- Matryoshka truncation (``dimensions``) is allowed when ``config.json`` or
  ``config_sentence_transformers.json`` lists ``matryoshka_dimensions`` (jina-embeddings-v3's
  key); the model's full width is always allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import msgspec

from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.model_json import model_json_file

PoolingMode = Literal["mean", "cls", "last"]

MAX_CONFIG_BYTES = 1 << 20
"""The largest pooling/module JSON file read (a model repository's file is untrusted)."""


class PoolingSpec(msgspec.Struct, frozen=True):
    """``mode``: which tokens make the vector; ``normalize``: scale it to unit L2 length;
    ``matryoshka``: the model was trained so any prefix of its vector is an embedding
    (``dimensions`` below its width allowed)."""

    mode: PoolingMode
    normalize: bool = True
    matryoshka: bool = False


class PoolingConfigError(ValueError):
    """A model's pooling files are unreadable, too large or name no mode we support."""


def _read_json(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return model_json_file(path, path.name, MAX_CONFIG_BYTES)
    except (UnsupportedModelError, OSError) as exc:
        raise PoolingConfigError(str(exc)) from None


def mode_of_pooling_config(cfg: dict) -> PoolingMode:
    """The mode a sentence-transformers ``1_Pooling/config.json`` selects. Raises
    ``PoolingConfigError`` for max / weighted-mean / sqrt-length pooling or none at all."""
    if cfg.get("pooling_mode_cls_token"):
        return "cls"
    if cfg.get("pooling_mode_lasttoken"):
        return "last"
    if cfg.get("pooling_mode_mean_tokens"):
        return "mean"
    if isinstance(cfg.get("pooling_mode"), str) and cfg["pooling_mode"] in ("mean", "cls", "lasttoken"):
        return "last" if cfg["pooling_mode"] == "lasttoken" else cfg["pooling_mode"]  # type: ignore[return-value]
    raise PoolingConfigError("the Pooling module selects no supported mode (mean, cls or last token)")


def _st_modules(model_dir: Path) -> list[dict] | None:
    modules = _read_json(model_dir / "modules.json")
    if modules is None:
        return None
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise PoolingConfigError("modules.json is not a list of modules")
    return modules


def _matryoshka(model_dir: Path, config: dict) -> bool:
    st = _read_json(model_dir / "config_sentence_transformers.json")
    listed = config.get("matryoshka_dimensions") or (st or {}).get("matryoshka_dimensions")
    return isinstance(listed, list) and len(listed) > 0


def pooling_spec(model_dir: Path | str, *, causal: bool) -> PoolingSpec:
    """The ``PoolingSpec`` of the model in ``model_dir`` (``causal``: a decoder, else an
    encoder; used only when the model has no sentence-transformers modules). Raises
    ``PoolingConfigError`` for unreadable or unsupported pooling files."""
    model_dir = Path(model_dir)
    config = _read_json(model_dir / "config.json") or {}
    if not isinstance(config, dict):
        raise PoolingConfigError("config.json is not an object")
    matryoshka = _matryoshka(model_dir, config)
    modules = _st_modules(model_dir)
    if modules is None:
        return PoolingSpec("last" if causal else "mean", True, matryoshka)
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    pooling = next((m for m in modules if str(m.get("type", "")).endswith("Pooling")), None)
    if pooling is None:
        mode: PoolingMode = "last" if causal else "mean"
    else:
        folder = str(pooling.get("path", ""))
        if ".." in Path(folder).parts or Path(folder).is_absolute():
            raise PoolingConfigError(f"modules.json names a Pooling folder outside the model: {folder[:100]}")
        cfg = _read_json(model_dir / folder / "config.json")
        if not isinstance(cfg, dict):
            raise PoolingConfigError(f"{folder}/config.json is missing or not an object")
        mode = mode_of_pooling_config(cfg)
    return PoolingSpec(mode, "Normalize" in kinds, matryoshka)
