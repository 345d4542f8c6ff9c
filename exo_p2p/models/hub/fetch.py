"""The hub beside the peers when a node fetches a model (docs/models.md#models-from-a-hub).

``HubAccess`` is a node's way to a hub: none at all with ``--offline`` or ``HF_HUB_OFFLINE``
(nothing is ever asked of a hub then), else one ``HubClient`` per repo and commit, its
``User-Agent`` naming the node. ``read`` reads a repo's card and manifest
(``hub.manifest.resolve_hub_model``) through its ``hub.resolve.Resolver`` (own threads,
deadlines, single-flight); ``resolve`` also keeps its small files in the node's partial copy,
which the node then publishes: peers take the manifest and those files from it; ``preview``
keeps only the card, in memory, for placement previews.

``hub.manifest`` gives a fetching node the manifest of a hub model it has never seen: its
own copy's, else a peer's, else read from the hub at the pinned commit — refused when the
digest differs from the one placement chose. ``hub_get`` wraps a fetch's ``get_chunk`` so
that the holder ``HUB`` is answered with range requests. ``verify_files`` runs after a
fetch: a complete file that fails its LFS SHA-256 is discarded and the fetch fails with
``FetchError`` (a next round fetches it again).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import structlog
import trio

from exo_p2p.models.copies.disk_room import DiskFullError, check_room, is_disk_full, too_little
from exo_p2p.models.copies.partial import PartialModel
from exo_p2p.models.errors import FetchError
from exo_p2p.models.hub.client import HubClient, HubError, hub_offline, parse_repo
from exo_p2p.models.hub.hashing import arrivals
from exo_p2p.models.hub.manifest import check_complete_files, resolve_hub_model, store_known
from exo_p2p.models.hub.resolve import Resolver
from exo_p2p.models.hub_limits import PREVIEW_CACHE, PREVIEW_TTL
from exo_p2p.models.manifest import chunk_span
from exo_p2p.models.transfer.chunk_sets import wanted_chunks
from exo_p2p.models.transfer.fetch import GetChunk
from exo_p2p.models.transfer.fetch_queue import HUB
from exo_p2p.models.transfer.protocols import fetch_held
from exo_p2p.types.manifest import ModelManifest
from exo_p2p.types.models import HubSource, ModelCard

log = structlog.get_logger(__name__)


@dataclass
class HubAccess:
    """A node's access to a hub: ``offline`` (the node's ``--offline``) and the node id its
    requests name. Clients are cached per (repo, commit): their file lists are read once."""

    offline: bool = False
    node_id: str = ""

    def __post_init__(self) -> None:
        self._clients: dict[tuple[str, str | None], HubClient] = {}
        self.resolver = Resolver()  # own limiter, deadlines, single-flight (hub_resolve)
        self._previews: OrderedDict[str, tuple[float, HubSource, ModelCard]] = OrderedDict()

    @property
    def enabled(self) -> bool:
        """False with ``--offline`` or ``HF_HUB_OFFLINE`` (read now)."""
        return not hub_offline(self.offline)

    def client(self, repo_id: str, revision: str | None) -> HubClient:
        """The client of ``repo_id`` at ``revision``. Raises ``HubError`` when offline."""
        if not self.enabled:
            raise HubError("this node is offline (--offline or HF_HUB_OFFLINE=1): it never asks a model hub")
        key = (repo_id, revision)
        if key not in self._clients:
            self._clients[key] = HubClient(repo_id, revision, user_agent={"exo-p2p-node": self.node_id or "unknown"})
        return self._clients[key]

    async def read(self, name: str):  # type: ignore[no-untyped-def]
        """``(source, card, manifest, known bytes)`` of ``name`` (``ORG/NAME[@REV]``) read from
        the hub by ``self.resolver`` (bounded, shared by concurrent callers, abandoned on
        cancel). Raises ``HubError``, ``UnsupportedModelError``, ``HubTimeout``, ``ValueError``
        (not a repo id)."""
        repo, revision = parse_repo(name)
        client = self.client(repo, revision)
        got = await self.resolver.run((repo, revision), resolve_hub_model, client, repo,
                                      what=f"reading model {repo} from the hub")
        self._clients[(repo, got[0].revision)] = client
        return got

    async def preview(self, name: str) -> tuple[HubSource, ModelCard]:
        """Card and source of ``name`` for a placement preview: read as ``read`` does, nothing
        stored (no depot file, no State), kept ``PREVIEW_TTL`` s (at most ``PREVIEW_CACHE``
        models). Raises as ``read``."""
        now = trio.current_time()
        kept = self._previews.get(name)
        if kept is not None and now - kept[0] < PREVIEW_TTL:
            return kept[1], kept[2]
        source, card, _manifest, _known = await self.read(name)
        self._previews[name] = (now, source, card)
        self._previews.move_to_end(name)
        while len(self._previews) > PREVIEW_CACHE:
            self._previews.popitem(last=False)
        return source, card

    def previewed(self, repo_id: str) -> tuple[HubSource, ModelCard] | None:
        """What ``preview`` last kept for repo ``repo_id`` at any revision (None: nothing, or too old)."""
        now = trio.current_time()
        for at, source, card in reversed(self._previews.values()):
            if source.repo_id == repo_id and now - at < PREVIEW_TTL:
                return source, card
        return None

    async def resolve(self, name: str, depot) -> tuple[HubSource, ModelCard]:  # type: ignore[no-untyped-def]
        """Card and source of ``name`` (``ORG/NAME[@REV]``) read from the hub (``read``); its
        manifest's small files and headers are stored in ``depot``'s partial copy when the
        node's disk has room for them (``keep_known``). Raises as ``read``, and
        ``DiskFullError`` (``exo_p2p.models.copies.disk_room``)."""
        source, card, manifest, known = await self.read(name)
        await keep_known(depot, manifest, known)
        log.info("model read from the hub", model=source.repo_id, commit=source.revision, layers=card.n_layers,
                 bytes=card.storage_size, digest=source.digest[:12])
        return source, card


async def hub_manifest(access: HubAccess, source: HubSource, depot) -> ModelManifest:  # type: ignore[no-untyped-def]
    """The manifest of ``source`` read from the hub at its commit; its small files are
    stored in ``depot``'s partial copy (``keep_known``). Raises ``FetchError`` when the hub's
    files now give another digest (``DiskFullError`` when the disk has no room for them),
    ``HubError`` when the hub cannot be read."""
    client = access.client(source.repo_id, source.revision)
    got, _card, manifest, known = await access.resolver.run(
        (source.repo_id, source.revision), resolve_hub_model, client, source.repo_id,
        what=f"reading model {source.repo_id} from the hub")
    if got.digest != source.digest:
        raise FetchError(f"model {source.repo_id} at {source.revision[:12]} gives manifest {got.digest[:12]} here, "
                         f"not {source.digest[:12]} as placed; place it again")
    await keep_known(depot, manifest, known)
    return manifest


async def keep_known(depot, manifest: ModelManifest, known: dict[str, bytes]) -> None:  # type: ignore[no-untyped-def]
    """Store ``known`` (a resolve's small files and headers, already bounded in size by
    ``hub_limits``) in ``depot``'s partial copy of ``manifest`` and flush it, when the disk
    has room for them (``disk_room.check_room``, else ``DiskFullError``). A write that finds
    the disk full all the same removes the copy and raises ``DiskFullError`` naming the free
    bytes (``exo_p2p.models.copies.disk_room``)."""
    what = f"model {manifest.name}'s config and tokenizer files"
    need = sum(len(b) for b in known.values())
    check_room(what, need, await trio.to_thread.run_sync(depot.disk_free), depot.models_dir)
    try:
        partial = depot.partial(manifest)
        await trio.to_thread.run_sync(store_known, partial, known)
        await trio.to_thread.run_sync(partial.flush)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        await trio.to_thread.run_sync(depot.discard, manifest.digest)
        free = await trio.to_thread.run_sync(depot.disk_free)
        log.warning("disk full while keeping a hub model's files; its copy removed", model=manifest.name, free_bytes=free)
        raise DiskFullError(too_little(what, need, free, depot.models_dir), free) from exc


def hub_get(inner: GetChunk, client: HubClient, manifest: ModelManifest) -> GetChunk:
    """``get_chunk`` answering the holder ``HUB`` from ``client`` (range requests in a
    thread, abandoned when the fetch gives up on it) and every other holder with ``inner``."""

    async def get(peer: str, path: str, index: int) -> bytes:
        if peer != HUB:
            return await inner(peer, path, index)
        start, end = chunk_span(manifest, path, index)
        return await trio.to_thread.run_sync(client.get_range, path, start, end, abandon_on_cancel=True)

    return get


HELD_TIMEOUT = 10.0
"""Seconds to ask one peer which chunks it holds."""


async def held_maps(net, digest: str, holders) -> dict[str, dict[str, tuple[int, ...]]]:  # type: ignore[no-untyped-def]
    """Peer -> the chunks of ``digest`` it holds, for every holder but ``HUB`` that answers
    ``HELD_PROTOCOL`` within ``HELD_TIMEOUT`` (asked at once); one that does not is left
    out (then asked chunk by chunk, as before)."""
    out: dict[str, dict[str, tuple[int, ...]]] = {}

    async def ask(peer: str) -> None:
        try:
            out[peer] = await fetch_held(net, peer, digest, timeout=HELD_TIMEOUT)
        except Exception as exc:  # an older node, a peer gone: asked chunk by chunk
            log.info("peer did not say which chunks it holds", peer=peer, error=str(exc))

    async with trio.open_nursery() as nursery:
        for peer in holders:
            if peer != HUB:
                nursery.start_soon(ask, peer)
    return out


def hub_run(client: HubClient, partial: PartialModel):  # type: ignore[no-untyped-def]
    """``get_run`` for ``fetch_chunks``: consecutive chunks ``indices`` of ``path`` in one
    range request to the hub, streamed (``HubClient.stream_range``, in a thread): each chunk
    is handed to ``deliver`` as soon as its bytes are in, so at most one chunk per request is
    held in memory, hashed on arrival (before it is stored) and, once stored, fed to its
    file's hash (``hub.hashing.arrivals``)."""
    hashes = arrivals(partial)

    def stream(path: str, indices: list[int], deliver) -> None:  # type: ignore[no-untyped-def]
        spans = [chunk_span(partial.manifest, path, i) for i in indices]
        at = [0]  # the chunk being filled
        parts: list[bytes] = []
        have = [0]

        def sink(block: bytes) -> None:
            while block:
                start, end = spans[at[0]]
                take = min(len(block), end - start - have[0])
                parts.append(block[:take] if take < len(block) else block)
                have[0] += take
                block = block[take:]
                if have[0] == end - start:
                    data = b"".join(parts)
                    parts.clear()
                    have[0] = 0
                    index = indices[at[0]]
                    at[0] += 1
                    hashes.note(path, index, data)  # before it is held: never hashed again
                    if deliver(index, data) in (True, False):  # stored (or held already)
                        try:
                            hashes.add(path, index, data)
                        except OSError:  # a file renamed under a read-back: its frontier waits
                            log.debug("chunk not hashed on arrival", path=path, index=index)

        client.stream_range(path, spans[0][0], spans[-1][1], sink)

    async def get_run(path: str, indices: list[int], deliver) -> None:  # type: ignore[no-untyped-def]
        await trio.to_thread.run_sync(stream, path, indices, deliver, abandon_on_cancel=True)

    return get_run


SHARED_WAIT = 60.0
"""Seconds a rank waits for a lower rank's node to have the chunks both need (a tied
embedding) before it takes them from the hub itself."""


async def await_shared(net, digest: str, owners: list[str], shared: dict[str, tuple[int, ...]],  # type: ignore[no-untyped-def]
                       timeout: float = SHARED_WAIT) -> bool:
    """Wait (polling every second, at most ``timeout`` s) until the nodes ``owners`` hold
    every chunk of ``shared`` between them; whether they do."""
    with trio.move_on_after(timeout):
        while True:
            maps = await held_maps(net, digest, owners)
            have = {(p, i) for held in maps.values() for p, idx in held.items() for i in idx}
            if all((p, i) in have for p, idx in shared.items() for i in idx):
                return True
            await trio.sleep(1.0)
    return False


def shared_chunks(manifest: ModelManifest, instance, shard, wanted, *, tied: bool):  # type: ignore[no-untyped-def]
    """``(chunks of wanted a lower rank also fetches, their nodes)``: a pipeline rank takes
    those from that rank's node, not from the hub a second time (``await_shared``)."""
    if instance.sharding == "tensor" or shard.world_size == 1:
        return {}, []
    mine = {(p, i) for p, idx in wanted.items() for i in idx}
    shared: set[tuple[str, int]] = set()
    owners: list[str] = []
    for other in instance.shards:
        if other.rank < shard.rank and other.node_id != shard.node_id:
            theirs = wanted_chunks(manifest, instance, other, tied=tied)
            both = {(p, i) for p, i in mine & {(p, i) for p, idx in theirs.items() for i in idx}
                    if not manifest.file(p).chunks[i].sha256}  # weights only the hub had
            if both:
                shared |= both
                owners.append(other.node_id)
    out: dict[str, tuple[int, ...]] = {}
    for p, i in sorted(shared):
        out[p] = (*out.get(p, ()), i)
    return out, owners


async def verify_files(partial: PartialModel, client: HubClient) -> None:
    """Check the complete files of ``partial`` against the hub's LFS SHA-256
    (``hub.manifest.check_complete_files``, with the hashes taken as the bytes arrived:
    ``hub.hashing``). Raises ``FetchError`` naming the files that failed (discarded:
    fetched again by the next round)."""
    if not client.files:
        await trio.to_thread.run_sync(client.info)
    shas = {p: f.sha256 for p, f in client.files.items() if f.sha256}
    hashes = arrivals(partial)
    bad = await trio.to_thread.run_sync(check_complete_files, partial, shas, hashes.file_sha256)
    for path in bad:
        hashes.forget(path)
    if bad:
        log.warning("file failed its hub SHA-256; discarded to be fetched again", files=bad)
        raise FetchError(f"{', '.join(bad)} of {partial.manifest.name} failed the hub's SHA-256 and will be fetched again")
