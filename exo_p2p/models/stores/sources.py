"""What a node's model store finds (docs/models.md#model-stores): a model's source, or a model
it found but cannot serve and why; the models of an extra dir (``dir_models``) and of the
Hugging Face cache (``hf_cache_models``). The stores' own rules live in
``exo_p2p.models.stores.ollama`` and ``exo_p2p.models.stores.lmstudio``; which source wins, in
``exo_p2p.models.stores.store``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog

from exo_p2p.models.card.derive import WEIGHT_GLOB

log = structlog.get_logger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
"""An MLX-format directory needs at least one of these."""

Origin = Literal["embedded", "models_dir", "pulled", "hf_cache", "ollama", "lmstudio"]
"""Where a model was found: the embedded GGUF, a ``--models-dir``, this node's ``pulled`` dir,
the Hugging Face cache, an Ollama install, LM Studio's models dir."""


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: an MLX-format directory, or a GGUF file to import (``path``;
    an Ollama blob is a GGUF without the suffix), found in ``origin``."""

    model_id: str
    kind: Literal["mlx_dir", "gguf"]
    path: Path
    origin: Origin = "models_dir"


@dataclass(frozen=True)
class Unsupported:
    """A model a store holds that this node cannot serve: its name, where it was found, the
    file or dir at fault (``path``) and ``reason`` (one line naming what is missing or wrong:
    the file, the layer, the architecture, the tensor type)."""

    model_id: str
    origin: Origin
    path: Path
    reason: str


def mlx_dir_problem(path: Path) -> str | None:
    """What keeps ``path`` from being an MLX-format model directory (``config.json``,
    ``model*.safetensors``, a tokenizer file), in words; None when nothing does."""
    if not path.is_dir():
        return "not a directory"
    if (path / "model_index.json").is_file():  # an image pipeline's components (exo_p2p.images.card)
        gone = [c for c in ("transformer", "text_encoder", "vae", "tokenizer") if not (path / c).is_dir()]
        return f"no {', no '.join(gone)} folder" if gone else None
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any(path.glob(WEIGHT_GLOB)):
        missing.append(f"weights ({WEIGHT_GLOB})")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        missing.append(f"tokenizer file ({', '.join(TOKENIZER_FILES)})")
    return f"no {', no '.join(missing)}" if missing else None


def is_mlx_model_dir(path: Path) -> bool:
    """Whether ``path`` is a directory with ``config.json``, ``model*.safetensors`` and a
    tokenizer file."""
    return mlx_dir_problem(path) is None


def hf_cache_models() -> list[ModelSource]:
    """MLX-format models in the Hugging Face cache (rule 3 of the module docstring), by
    repo id; an absent, unreadable or corrupted cache gives none (logged at debug level)."""
    try:
        from huggingface_hub import constants, scan_cache_dir  # lazy: a ~0.2 s import, hub reads only

        # read the environment now, not at import (a node started with another HF_HOME)
        hub = os.environ.get("HF_HUB_CACHE") or (
            str(Path(os.environ["HF_HOME"]) / "hub") if os.environ.get("HF_HOME") else constants.HF_HUB_CACHE)
        info = scan_cache_dir(hub)
    except Exception as exc:  # no cache dir (the usual case), or a broken one
        log.debug("no Hugging Face cache", error=str(exc))
        return []
    out = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        newest = max(repo.revisions, key=lambda r: r.last_modified)
        if is_mlx_model_dir(newest.snapshot_path):
            out.append(ModelSource(repo.repo_id, "mlx_dir", Path(newest.snapshot_path), "hf_cache"))
    return out


def dir_models(directory: Path, origin: Origin = "models_dir") -> list[ModelSource]:
    """The models of one extra dir (rule 2 of the module docstring), by entry name; an absent
    or unreadable dir has none."""
    try:
        entries = sorted(directory.iterdir()) if directory.is_dir() else []
    except OSError:
        return []
    out: list[ModelSource] = []
    for entry in entries:
        if entry.suffix.lower() == ".gguf" and entry.is_file():
            out.append(ModelSource(entry.stem.lower(), "gguf", entry, origin))
        elif is_mlx_model_dir(entry):
            out.append(ModelSource(entry.name, "mlx_dir", entry, origin))
        elif entry.is_dir() and not entry.name.startswith("."):  # ORG/NAME
            try:
                subs = sorted(entry.iterdir())
            except OSError:  # unreadable: not a model
                continue
            out.extend(ModelSource(f"{entry.name}/{sub.name}", "mlx_dir", sub, origin)
                       for sub in subs if is_mlx_model_dir(sub))
    return out
