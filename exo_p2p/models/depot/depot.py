"""A node's side of models travelling between nodes (docs/models.md): what it can serve, what it
holds (complete or partial), and fetching chunks from peers.

Layout under ``data_dir/models``:

- ``.manifests/<name>.manifest.json``: cached manifests of local models (``cached_manifest``);
- ``.fetched/<digest>/``: a copy being fetched (``PartialModel``; kept when an instance is
  deleted, so a later placement reuses its chunks);
- ``.fetched/.views/<digest>/<runner id>/``: the shard views ranks load from, hard links to
  the copy's files (``PartialModel.shard_view``);
- ``pulled/<name>/``: a complete copy made by a pull (renamed from ``.fetched``); the node
  lists it as a local model (the store scans this dir like a ``--models-dir``).

At start the node deletes (and logs) what in ``.fetched`` no copy owns (``clean_orphans``):
dirs without a manifest, views of copies deleted since; and, when the disk has less than
``disk_room.DATA_DIR_RESERVE_BYTES`` free, the incomplete copies no placement uses
(``copies.cleanup.reclaim_fetched``, from ``Node`` before anything writes).

A shard view never points at a file that moves: its hard links stay valid when a ``.part``
is renamed and when a pull promotes the copy a running rank loads from to ``pulled/`` (the
views stay where they are). ``rm`` deletes a model's views with its copies (only they still
hold the bytes of its files).

Serving: ``ModelServer`` (libp2p chunk protocol) and ``BulkServer`` (ticket + TCP) read from
``source(digest)``: a complete local model or the verified chunks of a partial copy.
Fetching (``fetch``): bulk path first, per peer; a peer whose bulk path fails (no ticket, the
connection refused, closed, stalled or malformed) is asked over the libp2p chunk protocol
instead (``exo_p2p.models.transfer.bulk_client``). Limits: ``exo_p2p.models.transfer.fetch.FetchLimits``.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import msgspec
import structlog
import trio

from exo_p2p.models.copies.cleanup import clean_fetched, remove_pulled
from exo_p2p.models.copies.files import MANIFEST_FILE
from exo_p2p.models.copies.partial import PartialModel
from exo_p2p.models.depot.held import held_models
from exo_p2p.models.depot.serve_faults import ServeFaults
from exo_p2p.models.gguf.importer import IMPORT_MARKER
from exo_p2p.models.hub.fetch import held_maps, hub_get, hub_run
from exo_p2p.models.manifest import cached_manifest
from exo_p2p.models.names import check_model_name
from exo_p2p.models.stores.store import REFRESH_SECONDS, ModelStore, is_mlx_model_dir
from exo_p2p.models.transfer.bulk import BulkServer, listen_hosts
from exo_p2p.models.transfer.bulk_client import fetch_getter
from exo_p2p.models.transfer.fetch import DEFAULT_LIMITS, FetchLimits, FetchReport, Progress, fetch_chunks
from exo_p2p.models.transfer.protocols import ChunkSource, LocalModel, ModelServer, chunk_getter
from exo_p2p.types.manifest import HeldModel, ModelManifest

log = structlog.get_logger(__name__)

PULLED_DIR = "pulled"
FETCHED_DIR = ".fetched"


class ModelDepot:
    """Manifests and copies of one node's models (layout and rules: module docstring).

    ``refresh`` (blocking: hashes new models; run it in a thread) recomputes what is held;
    every other method only reads what it found. Thread-safe for that split.
    """

    def __init__(self, store: ModelStore, data_dir: Path, *, fault_hooks: Mapping[str, str] | None = None) -> None:
        self.store = store
        self.models_dir = Path(data_dir) / "models"
        self.fetched_dir = self.models_dir / FETCHED_DIR
        self.pulled_dir = self.models_dir / PULLED_DIR
        self._lock = threading.Lock()
        self.bytes_received: dict[str, int] = {}
        """Model bytes received by completed fetches, by the peer that sent them."""
        self._local: dict[str, tuple[str, LocalModel]] = {}  # digest -> (first name, source)
        self._names: dict[str, str] = {}  # every local model's name -> digest (one digest may have several)
        self._partials: dict[str, PartialModel] = {}
        self._faults = ServeFaults(fault_hooks)  # tests only (--fault-hook)
        self.bulk = BulkServer(self.source)
        self.server = ModelServer(self.source)

    # -- what this node holds -------------------------------------------------------------
    def refresh(self) -> None:
        """Re-scan the store's models (manifests cached by path, size, mtime) and the partial
        copies. A model whose manifest cannot be built is logged and left out."""
        local: dict[str, tuple[str, LocalModel]] = {}
        names: dict[str, str] = {}
        for model_id, src in sorted(self.store.sources().items()):
            model_dir = src.path if src.kind == "mlx_dir" else self.store.import_dir(model_id)
            if src.kind == "gguf" and not (model_dir / IMPORT_MARKER).exists():
                continue  # not imported yet: its manifest needs the imported files
            if not is_mlx_model_dir(model_dir):
                continue
            try:
                manifest = cached_manifest(model_dir, model_id, self.models_dir / ".manifests")
            except (OSError, ValueError) as exc:
                log.warning("model has no manifest", model_id=model_id, error=str(exc))
                continue
            local.setdefault(manifest.digest, (model_id, LocalModel(model_dir, manifest)))
            names[model_id] = manifest.digest
        with self._lock:
            self._local, self._names = local, names
            for root in sorted(self.fetched_dir.glob("*")) if self.fetched_dir.is_dir() else []:
                if root.name in self._partials or not (root / MANIFEST_FILE).is_file():
                    continue
                try:
                    manifest = msgspec.json.decode((root / MANIFEST_FILE).read_bytes(), type=ModelManifest)
                    self._partials[manifest.digest] = PartialModel(root, manifest)
                except (OSError, ValueError, msgspec.DecodeError) as exc:
                    log.warning("unreadable partial model copy", path=str(root), error=str(exc))

    def held(self) -> tuple[HeldModel, ...]:
        """What the profile publishes (rule: ``exo_p2p.models.depot.held.held_models``): every
        name of every complete local model, every partial copy."""
        with self._lock:
            partials = [(p.manifest.name, d, p.complete) for d, p in self._partials.items()]
            return held_models(self._names.items(), partials)

    def disk_free(self) -> int:
        """Free bytes on the file system of the models dir."""
        self.models_dir.mkdir(parents=True, exist_ok=True)
        return shutil.disk_usage(self.models_dir).free

    def manifest(self, digest: str) -> ModelManifest | None:
        source = self.source(digest)
        return source.manifest if source is not None else None

    def local_digest(self, name: str) -> str | None:
        """The digest of the complete local model called ``name`` (None: not held)."""
        with self._lock:
            return self._names.get(name)

    def source(self, digest: str) -> ChunkSource | None:
        """What to serve ``digest`` from: the complete local model, else the partial copy."""
        with self._lock:
            source: ChunkSource | None = self._local[digest][1] if digest in self._local else self._partials.get(digest)
        return self._faults.wrap(source)

    # -- serving ---------------------------------------------------------------------------
    async def run(self, net, *, task_status=trio.TASK_STATUS_IGNORED) -> None:  # type: ignore[no-untyped-def]
        """Register the protocols on ``net``, delete what ``clean_orphans`` finds (before
        ``task_status.started``: no fetch runs yet) and serve bulk connections until cancelled
        (on the IPv4 addresses ``net`` listens on: ``exo_p2p.models.transfer.bulk.listen_hosts``);
        re-scan the models every ``REFRESH_SECONDS`` (the first scan hashes new models in a
        thread after start, so a node with large models is not held up)."""
        self.server.register(net)
        self.bulk.register(net)
        async with trio.open_nursery() as nursery:
            # where libp2p listens, never the wildcard (exo_p2p.models.transfer.bulk)
            await nursery.start(self.bulk.run, listen_hosts(net.listen_addrs()))
            await trio.to_thread.run_sync(self.clean_orphans)  # before any fetch of this run
            task_status.started()
            while True:
                try:
                    await trio.to_thread.run_sync(self.refresh)
                except Exception as exc:  # a scan failure must not stop serving
                    log.warning("model scan failed", error=repr(exc))
                await trio.sleep(REFRESH_SECONDS)

    def verified_bytes(self, digest: str) -> int:
        """Bytes of manifest ``digest`` already verified in this node's partial copy (0: none)."""
        with self._lock:
            p = self._partials.get(digest)
        return p.verified_bytes() if p is not None else 0

    # -- fetching --------------------------------------------------------------------------
    def partial(self, manifest: ModelManifest) -> PartialModel:
        """The partial copy of ``manifest`` (created on first use)."""
        with self._lock:
            p = self._partials.get(manifest.digest)
            if p is None:
                p = PartialModel(self.fetched_dir / manifest.digest, manifest)
                self._partials[manifest.digest] = p
            return p

    async def fetch(
        self,
        net,  # type: ignore[no-untyped-def]
        manifest: ModelManifest,
        wanted: Mapping[str, Sequence[int]],
        holders: Sequence[str],
        *,
        limits: FetchLimits = DEFAULT_LIMITS,
        on_progress: Progress | None = None,
        hub=None,  # type: ignore[no-untyped-def]
    ) -> FetchReport:
        """Fetch ``wanted`` chunks of ``manifest`` from ``holders`` into its partial copy
        (``fetch_chunks``; raises its ``FetchError``); the holder ``HUB`` is read through
        ``hub`` (an ``exo_p2p.models.hub.client.HubClient``)."""
        partial = self.partial(manifest)
        p2p_get = chunk_getter(net, manifest.digest, timeout=limits.chunk_timeout)
        get, close = fetch_getter(net, manifest.digest, p2p_get, timeout=limits.chunk_timeout)
        known = run = None
        if hub is not None:
            get, run = hub_get(get, hub, manifest), hub_run(hub, partial)
            known = await held_maps(net, manifest.digest, holders)
        try:
            report = await fetch_chunks(partial, wanted, holders, get, limits=limits, on_progress=on_progress,
                                        known_held=known, get_run=run)
        finally:
            await close()
        for peer, nbytes in report.bytes_by_peer.items():  # GET /metrics: exo_model_transfer_bytes
            self.bytes_received[peer] = self.bytes_received.get(peer, 0) + nbytes
        return report

    def promote(self, digest: str, name: str, into: Path | None = None) -> Path:
        """Move a complete partial copy to ``pulled/<name>`` (``into/<name>`` when given: a
        ``--models-dir``) — a local model called ``name``
        from now on; the name the user pulled, not the one inside the manifest, which its
        digest does not cover — and return its dir. The ``PartialModel`` follows it (its
        ``root`` is the new dir): a rank's fetch that took it before builds its shard view
        from the moved files. Raises ``ValueError`` when it is not complete, the name is
        taken or unsafe (``check_model_name``)."""
        check_model_name(name)
        with self._lock:
            p = self._partials.get(digest)
            if p is None or not p.complete:
                raise ValueError(f"model {digest[:12]} is not completely fetched")
            target = (self.pulled_dir if into is None else Path(into)) / name
            if target.exists():
                raise ValueError(f"{target} already exists")
            p.close()
            # views inside the copy: the layout before views moved out of it (never read now);
            # the views in p.views_dir stay: running ranks load from them
            shutil.rmtree(p.root / ".views", ignore_errors=True)
            for name in (".verified",):
                (p.root / name).unlink(missing_ok=True)
            target.parent.mkdir(parents=True, exist_ok=True)  # pulled/ORG for ORG/NAME
            os.replace(p.root, target)
            p.root = target  # a rank's fetch holding this copy builds its view from here
            del self._partials[digest]
        return target

    def dissolve(self, digest: str, move: Callable[[Path], Path]) -> Path:
        """Hand the files of the complete partial copy ``digest`` to ``move(root)`` (e.g.
        ``exo_p2p.models.hub.cache.land``, which moves them elsewhere), then delete the copy's
        dir and forget it; what ``move`` returned. Under the depot's lock, so no ``refresh``
        re-opens the copy halfway; its shard views stay (hard links). Raises ``ValueError``
        when it is not complete, and what ``move`` raises (the copy is then closed, kept on
        disk, and re-opened by the next ``refresh``)."""
        with self._lock:
            p = self._partials.get(digest)
            if p is None or not p.complete:
                raise ValueError(f"model {digest[:12]} is not completely fetched")
            p.close()
            del self._partials[digest]
            out = move(p.root)
            shutil.rmtree(p.root, ignore_errors=True)
        return out

    def clean_orphans(self) -> list[Path]:
        """Delete, logging each, the dirs in ``.fetched/`` that no copy owns; the deleted
        paths (rules: ``exo_p2p.models.copies.cleanup.clean_fetched``; a copy this depot has
        open, ``partial``: a running fetch, is never touched). Blocking (run it in a thread);
        the node runs it at start (``run``)."""
        if not self.fetched_dir.is_dir():
            return []
        with self._lock:
            open_copies = set(self._partials)
        return clean_fetched(self.fetched_dir, self.pulled_dir, open_copies)

    def remove(self, name: str) -> list[Path]:
        """Delete this node's fetched and pulled copies of ``name``; the removed dirs. Models
        in ``--models-dir`` dirs and the embedded model are never deleted (not ours).
        Raises ``ValueError`` for a name that is no model directory name (``check_model_name``:
        ``""``, ``..`` or ``a/../..`` would name the pulled dir or one above it)."""
        check_model_name(name)
        with self._lock:
            removed = [self._drop(d) for d, p in list(self._partials.items()) if p.manifest.name == name]
        return removed + remove_pulled(self.pulled_dir, self.fetched_dir, name)

    def discard(self, digest: str) -> Path | None:
        """Delete the partial copy ``digest`` and its views (a write that found the disk full:
        ``exo_p2p.models.copies.disk_room``); its dir, or None when there was none. Blocking."""
        with self._lock:
            return self._drop(digest) if digest in self._partials else None

    def _drop(self, digest: str) -> Path:
        """Close, delete and forget the partial copy ``digest`` (the lock held)."""
        p = self._partials.pop(digest)
        p.close()
        shutil.rmtree(p.root, ignore_errors=True)
        shutil.rmtree(p.views_dir, ignore_errors=True)
        return p.root
