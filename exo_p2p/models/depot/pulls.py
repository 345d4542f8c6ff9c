"""Whole-model pulls: copy a model another node holds onto this node (docs/models.md, ``exo-p2p pull``).

``holders_of`` is the rule (pure, from State): the nodes whose profile lists a *complete*
manifest of that name (partial copies serve shards, not pulls), narrowed to ``from_node`` when
given; several different manifests under one name are refused as ambiguous unless
``from_node`` picks one. ``PullManager`` runs one pull per model name at a time in the
node's nursery and keeps its progress (``PullStatus``) for the API.

A repo id (``ORG/NAME[@REV]``) no node holds completely is pulled from the hub when the
node may ask one (``exo_p2p.models.hub.fetch.HubAccess``): the chunks other nodes hold
come from them, the rest from the hub; every file is checked against the hub's SHA-256;
the copy lands in the user's Hugging Face cache (``exo_p2p.models.hub.cache``), where
other tools see it and this node lists it, or in the node's first ``--models-dir`` as
``ORG/NAME`` when it has one.

One pull per manifest at a time: pulls of one manifest's files under two names would write
one partial copy (``.fetched/DIGEST``), and the first to finish moves it to its
``pulled/NAME``, under the other's fetch. So a pull whose manifest another running pull
fetches is refused (``PullConflict``, HTTP 409, naming that pull); pull it again once that
one has ended.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import structlog
import trio

from exo_p2p import defaults
from exo_p2p.models.depot.depot import ModelDepot
from exo_p2p.models.depot.shard_fetch import holders as peers_of
from exo_p2p.models.errors import FetchError
from exo_p2p.models.hub.cache import cache_dir, land
from exo_p2p.models.hub.client import HubClient, is_repo_id, parse_repo, preload
from exo_p2p.models.hub.fetch import HubAccess, verify_files
from exo_p2p.models.hub.hashing import arrivals
from exo_p2p.models.manifest import seed_cached_manifest
from exo_p2p.models.names import check_model_name
from exo_p2p.models.transfer.chunk_sets import all_chunks
from exo_p2p.models.transfer.fetch import Progress
from exo_p2p.models.transfer.fetch_queue import HUB
from exo_p2p.models.transfer.protocols import fetch_manifest
from exo_p2p.types import HubSource, State

log = structlog.get_logger(__name__)

HUB_PULL_ROUNDS = 3
"""Fetches of a hub pull before a file that keeps failing its SHA-256 fails the pull."""
MANIFEST_TIMEOUT = defaults.MODEL_MANIFEST_TIMEOUT
"""Seconds to get a manifest from one holder."""


class PullError(ValueError):
    """A pull cannot start: unknown model, no holder, ambiguous name (message says why)."""


class PullConflict(PullError):
    """A pull cannot start now: the model is already here, or already being pulled (under this
    name or, for the same manifest, another one). HTTP 409."""


class PullStatus(msgspec.Struct):
    """Progress of one pull: ``state`` is ``running``, ``done`` or ``failed`` (``error``
    says why); bytes of the model's chunks, done and total; seconds since it started; bytes
    received per holder and chunks that failed verification per sender."""

    model: str
    digest: str
    holders: tuple[str, ...]
    state: str = "running"
    bytes_done: int = 0
    bytes_total: int = 0
    elapsed: float = 0.0
    error: str | None = None
    bytes_by_peer: dict[str, int] = msgspec.field(default_factory=dict)
    bad_chunks_by_peer: dict[str, int] = msgspec.field(default_factory=dict)
    bytes_from_peers: int = 0
    bytes_from_hub: int = 0
    path: str | None = None
    """Bytes received so far from other nodes and from a hub (a resumed pull's chunks on disk
    count in neither); once done, the copy's dir (``pulled/NAME``, a ``--models-dir``, or the
    snapshot in the Hugging Face cache)."""


def holders_of(state: State, name: str, me: str, from_node: str | None = None) -> tuple[str, list[str]]:
    """``(digest, holder node ids)`` of model ``name`` for a pull by node ``me`` (rule:
    module docstring). Raises ``PullError``."""
    by_digest: dict[str, list[str]] = {}
    for node_id, profile in sorted(state.nodes.items()):
        if node_id == me or (from_node is not None and node_id != from_node):
            continue
        for held in profile.held_models:
            if held.name == name and held.complete:
                by_digest.setdefault(held.digest, []).append(node_id)
    if not by_digest:
        where = f" on node {from_node}" if from_node else " on any other node"
        raise PullError(f"model {name!r} is not held completely{where}")
    if len(by_digest) > 1:
        listing = "; ".join(f"{d[:12]} on {', '.join(n)}" for d, n in sorted(by_digest.items()))
        raise PullError(f"model {name!r} names different files on different nodes ({listing}); "
                        f"choose one with --from NODE")
    ((digest, nodes),) = by_digest.items()
    return digest, nodes


def check_disk(to_fetch: int, free: int) -> None:
    """A pull of ``to_fetch`` more bytes starts only with that plus
    ``FETCH_DISK_HEADROOM_PERCENT`` free (``free`` bytes; the rule placement applies to a
    rank's fetch): a pull filling the disk would leave no room for the node's own event log.
    Raises ``FetchError`` saying how much is needed and free."""
    need = defaults.disk_needed(to_fetch)
    if free < need:
        raise FetchError(f"not enough free disk in the models dir: the pull needs {to_fetch} bytes "
                         f"+{defaults.FETCH_DISK_HEADROOM_PERCENT}% ({need}), {free} free")


async def _preload() -> None:
    """``hub.preload`` in a thread; a failure is logged (the first hub request then says it)."""
    try:
        await trio.to_thread.run_sync(preload)
    except Exception as exc:  # an import error must not take the node down
        log.warning("huggingface_hub could not be loaded ahead of a pull", error=str(exc))


class PullManager:
    """Runs pulls for one node (see module docstring). ``on_done`` runs after a pull's copy
    became a local model (the node re-lists its models). ``models_dir``: the node's first
    ``--models-dir``, where a pull from a hub lands (None: the Hugging Face cache)."""

    def __init__(self, depot: ModelDepot, net, me: str, state: Callable[[], State],  # type: ignore[no-untyped-def]
                 nursery: trio.Nursery, on_done: Callable[[], Awaitable[None]], hub: HubAccess | None = None,
                 models_dir: Path | None = None) -> None:
        self._depot, self._net, self._me, self._state = depot, net, me, state
        self._nursery, self._on_done, self._hub, self._models_dir = nursery, on_done, hub, models_dir
        self._revisions: dict[str, str | None] = {}  # a hub pull's revision, by repo id
        self.pulls: dict[str, PullStatus] = {}
        if hub is not None and hub.enabled:  # the library's import, not a pull's time
            nursery.start_soon(_preload)

    def start(self, name: str, from_node: str | None = None) -> PullStatus:
        """Start pulling ``name``; its status. Raises ``PullError`` (no holder, ambiguous, a
        name that cannot name a directory: ``check_model_name``), ``PullConflict`` (already
        held here, already running, its manifest being pulled under another name)."""
        try:
            check_model_name(name)
        except ValueError as exc:
            raise PullError(str(exc)) from None
        if self._depot.local_digest(name) is not None:
            raise PullConflict(f"model {name!r} is already on this node")
        current = self.pulls.get(name)
        if current is not None and current.state == "running":
            raise PullConflict(f"model {name!r} is already being pulled")
        try:
            digest, holders = holders_of(self._state(), name, self._me, from_node)
        except PullError:
            if from_node is not None or self._hub is None or not self._hub.enabled or not is_repo_id(name):
                raise
            digest, holders = "", []  # nobody holds it: from the hub (_from_hub)
            name, self._revisions[name] = parse_repo(name)
            if self._depot.local_digest(name) is not None:
                raise PullConflict(f"model {name!r} is already on this node")
        other = next((s for s in self.pulls.values() if s.digest == digest and s.state == "running"), None)
        if other is not None:  # one partial copy for both: rule in the module docstring
            raise PullConflict(f"the files of model {name!r} (manifest {digest[:12]}) are already being pulled "
                               f"as {other.model!r}; pull {name!r} again when that pull has ended (GET /models/pulls)")
        status = PullStatus(model=name, digest=digest, holders=tuple(holders))
        self.pulls[name] = status
        self._nursery.start_soon(self._run, status)
        return status

    async def _from_hub(self, status: PullStatus, progress: Progress) -> None:
        """Pull ``status.model`` from the hub (and the peers holding chunks of it): read its
        manifest, fetch every chunk (peers first), check every file's SHA-256 (a failed file
        is fetched again, at most ``HUB_PULL_ROUNDS`` rounds), then land the copy (``_land``)."""
        assert self._hub is not None
        revision = self._revisions.get(status.model)
        source, _card = await self._hub.resolve(f"{status.model}@{revision}" if revision else status.model, self._depot)
        status.digest = source.digest
        manifest = self._depot.manifest(source.digest)
        assert manifest is not None  # resolve stored its partial copy
        client = self._hub.client(source.repo_id, source.revision)
        check_disk(manifest.total_bytes - self._depot.verified_bytes(source.digest),
                   await trio.to_thread.run_sync(self._depot.disk_free))
        for attempt in range(HUB_PULL_ROUNDS):
            peers = peers_of(self._state(), source.digest, self._me)
            status.holders = (*peers, HUB)
            before = (status.bytes_from_peers, status.bytes_from_hub)

            def round_progress(done: int, total: int, peers_: int, hub_: int) -> None:
                progress(done, total, before[0] + peers_, before[1] + hub_)

            report = await self._depot.fetch(self._net, manifest, all_chunks(manifest), [*peers, HUB],
                                             on_progress=round_progress, hub=client)
            for peer, n in report.bytes_by_peer.items():
                status.bytes_by_peer[peer] = status.bytes_by_peer.get(peer, 0) + n
            try:
                await verify_files(self._depot.partial(manifest), client)
                break
            except FetchError:
                if attempt + 1 == HUB_PULL_ROUNDS:
                    raise
        status.path = str(await trio.to_thread.run_sync(self._land, source, client, status.model, revision))
        await trio.to_thread.run_sync(self._depot.refresh)
        await self._on_done()
        status.state = "done"
        log.info("model pulled from the hub", model=status.model, bytes=status.bytes_total, sources=status.bytes_by_peer,
                 path=status.path)

    def _land(self, source: HubSource, client: HubClient, name: str, revision: str | None) -> Path:
        """Where a complete hub copy goes (blocking): the node's first ``--models-dir`` as
        ``ORG/NAME`` when it has one, else the Hugging Face cache (``hub.cache.land``); the
        model's dir (the snapshot dir in the cache)."""
        partial = self._depot.partial(self._depot.manifest(source.digest))  # type: ignore[arg-type]
        full = arrivals(partial).full_manifest()  # every chunk hashed as it arrived, or None
        if self._models_dir is not None:
            where = self._depot.promote(source.digest, name, into=self._models_dir)
        else:
            blobs = {}
            for entry in partial.manifest.files:
                known = client.files.get(entry.path)
                blobs[entry.path] = (known.sha256 or known.blob_id) if known is not None else ""
            where = self._depot.dissolve(source.digest, lambda root: land(root, blobs, source.repo_id, source.revision,
                                                                         revision, cache_dir()))
        if full is not None:  # the node need not hash the copy again to serve it
            seed_cached_manifest(where, full, self._depot.models_dir / ".manifests")
        return where

    async def _run(self, status: PullStatus) -> None:
        start = trio.current_time()

        def progress(done: int, total: int, from_peers: int = 0, from_hub: int = 0) -> None:
            status.bytes_done, status.bytes_total = done, total
            status.bytes_from_peers, status.bytes_from_hub = from_peers, from_hub
            status.elapsed = trio.current_time() - start

        try:
            if not status.digest:
                await self._from_hub(status, progress)
                return
            manifest = None
            errors = []
            for peer in status.holders:
                try:
                    manifest = await fetch_manifest(self._net, peer, status.digest, timeout=MANIFEST_TIMEOUT)
                    break
                except Exception as exc:  # try the next holder
                    errors.append(f"{peer}: {exc}")
            if manifest is None:
                raise FetchError(f"no holder sent the manifest ({'; '.join(errors)})")
            check_disk(manifest.total_bytes - self._depot.verified_bytes(status.digest),
                       await trio.to_thread.run_sync(self._depot.disk_free))
            wanted = all_chunks(manifest)
            report = await self._depot.fetch(self._net, manifest, wanted, list(status.holders), on_progress=progress)
            status.bytes_by_peer = dict(report.bytes_by_peer)
            status.bad_chunks_by_peer = dict(report.bad_chunks_by_peer)
            status.path = str(await trio.to_thread.run_sync(self._depot.promote, status.digest, status.model))
            await trio.to_thread.run_sync(self._depot.refresh)
            await self._on_done()
            status.state = "done"
            log.info("model pulled", model=status.model, bytes=status.bytes_total, peers=status.bytes_by_peer)
        except Exception as exc:
            status.state, status.error = "failed", str(exc) or type(exc).__name__
            log.warning("model pull failed", model=status.model, error=str(exc))
        finally:
            status.elapsed = trio.current_time() - start
