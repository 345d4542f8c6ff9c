"""A rank's node fetches just its shard of a model it lacks, from the peers holding it (docs/models.md).

What a rank fetches (``chunk_sets.wanted_chunks``): for a pipeline rank of several, the chunks of
``exo_p2p.models.transfer.chunk_sets.shard_chunks`` (its layers' tensors, the embedding on rank 0, the
final norm and head on the last rank, every config/tokenizer file); a single rank or a
tensor-parallel rank fetches every chunk (a tensor rank slices every tensor).

Where from (``holders``): the nodes whose profile publishes the instance's manifest digest
(``Instance.model_digest``), complete copies first, then partial ones (another rank's node
that fetched an overlapping shard: the config files, a tied embedding); this node is never
its own holder. A partial holder lacking a chunk says so and the fetcher asks another
(``exo_p2p.models.transfer.fetch``).

Rounds (``fetch_shard``): a fetch that ends with ``FetchError`` (every holder dropped or
lacking some chunk) is tried again after ``MODEL_FETCH_ROUND_PAUSE`` seconds with the
holders State lists then (a holder that came back, a node that has fetched those chunks by
now), at most ``MODEL_FETCH_ROUNDS`` rounds; chunks verified in earlier rounds (or before
a restart: the partial copy's journal) are never fetched again. Then the error, naming the
holders and why each was dropped, fails the runner (and so the instance).

The hub: when State names a hub source of the model with this digest (``State.hub_models``)
and this node may ask a hub (``HubAccess``), the hub is the last holder: chunks no peer has
come from it (``exo_p2p.models.hub.fetch``); a node no peer sends the manifest to reads it
from the hub; complete files are checked against the hub's SHA-256 after each round.

The result is ``PartialModel.shard_view``: a directory of the files this rank reads, in
which every chunk it needs is verified.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import structlog
import trio

from exo_p2p import defaults
from exo_p2p.models.depot.depot import ModelDepot
from exo_p2p.models.errors import FetchError
from exo_p2p.models.hub.client import HubError
from exo_p2p.models.hub.fetch import HubAccess, await_shared, hub_manifest, shared_chunks, verify_files
from exo_p2p.models.transfer.chunk_sets import chunk_bytes_of, missing_chunks, wanted_chunks
from exo_p2p.models.transfer.fetch import DEFAULT_LIMITS, FetchLimits, Progress
from exo_p2p.models.transfer.fetch_queue import HUB
from exo_p2p.models.transfer.protocols import fetch_manifest
from exo_p2p.types import HubSource, Instance, ShardMetadata, State
from exo_p2p.types.manifest import ModelManifest

log = structlog.get_logger(__name__)


def holders(state: State, digest: str, me: str) -> list[str]:
    """Nodes other than ``me`` publishing manifest ``digest``: complete copies first, then
    partial ones, each group by node id (pure)."""
    complete, partial = [], []
    for node_id, profile in sorted(state.nodes.items()):
        if node_id == me:
            continue
        for held in profile.held_models:
            if held.digest == digest:
                (complete if held.complete else partial).append(node_id)
                break
    return complete + partial



async def _manifest(depot: ModelDepot, net, digest: str, peers: list[str]) -> ModelManifest:  # type: ignore[no-untyped-def]
    known = depot.manifest(digest)
    if known is not None:
        return known
    errors = []
    for peer in peers:
        try:
            return await fetch_manifest(net, peer, digest, timeout=defaults.MODEL_MANIFEST_TIMEOUT)
        except Exception as exc:  # try the next holder
            errors.append(f"{peer}: {exc}")
    raise FetchError(f"no holder sent manifest {digest[:12]} ({'; '.join(errors) or 'no holders'})")


def _hub_source(state: State, instance: Instance, hub: HubAccess | None) -> HubSource | None:
    """The hub source of ``instance``'s manifest, None when it has none or this node never
    asks a hub."""
    source = state.hub_models.get(instance.model_id)
    if source is None or source.digest != instance.model_digest or hub is None or not hub.enabled:
        return None
    return source


async def _fetch_hub_aware(depot: ModelDepot, net, manifest: ModelManifest, instance: Instance,  # type: ignore[no-untyped-def]
                           shard: ShardMetadata, wanted, peers: list[str], client, *, tied: bool,
                           limits: FetchLimits, on_progress: Progress | None):
    """``depot.fetch`` of ``wanted`` from ``peers`` (and the hub through ``client``); with a
    hub, the chunks a lower rank also fetches (a tied embedding) come last, once that rank's
    node holds them (``hub.fetch.await_shared``), so the hub sends them once."""
    if client is None:
        return await depot.fetch(net, manifest, wanted, peers, limits=limits, on_progress=on_progress)
    shared, owners = shared_chunks(manifest, instance, shard, wanted, tied=tied)
    own = missing_chunks(wanted, shared)
    own_total = chunk_bytes_of(manifest, own)
    total = chunk_bytes_of(manifest, wanted)

    before = [0, 0]  # bytes from peers and from the hub of the first fetch

    def first(done: int, _total: int, peers_: int, hub_: int) -> None:
        before[:] = [peers_, hub_]
        if on_progress:
            on_progress(done, total, peers_, hub_)

    def second(done: int, _total: int, peers_: int, hub_: int) -> None:
        if on_progress:
            on_progress(own_total + done, total, before[0] + peers_, before[1] + hub_)

    report = await depot.fetch(net, manifest, own, peers + [HUB], limits=limits, on_progress=first, hub=client)
    if shared:
        if not await await_shared(net, manifest.digest, owners, shared):
            log.info("the ranks sharing chunks with this one do not hold them yet; taking them from the hub")
        # the owners may have published their copies after this round listed the holders
        sources = peers + [o for o in owners if o not in peers] + [HUB]
        more = await depot.fetch(net, manifest, shared, sources, limits=limits, on_progress=second, hub=client)
        for peer, n in more.bytes_by_peer.items():
            report.bytes_by_peer[peer] = report.bytes_by_peer.get(peer, 0) + n
        report.bytes_fetched += more.bytes_fetched
        report.chunks_fetched += more.chunks_fetched
    return report


async def fetch_shard(
    depot: ModelDepot,
    net,  # type: ignore[no-untyped-def]
    me: str,
    get_state: Callable[[], State],
    instance: Instance,
    shard: ShardMetadata,
    *,
    on_progress: Progress | None = None,
    limits: FetchLimits = DEFAULT_LIMITS,
    rounds: int = defaults.MODEL_FETCH_ROUNDS,
    pause: float = defaults.MODEL_FETCH_ROUND_PAUSE,
    hub: HubAccess | None = None,
) -> Path:
    """Fetch this rank's chunks of ``instance``'s model and return the directory to load
    it from (rules: module docstring).

    Raises:
        FetchError: no holder left after ``rounds`` rounds, or none sent the manifest
            (the message names the holders and why each failed).
        ValueError: the instance names no manifest (placed by a master before manifests).
    """
    digest = instance.model_digest
    if not digest:
        raise ValueError(f"model {instance.model_id} is not on this node and its placement names no manifest to fetch")
    card = get_state().model_cards.get(instance.model_id)
    tied = bool(card.tie_word_embeddings) if card is not None else False
    last: Exception | None = None
    for attempt in range(max(1, rounds)):
        if attempt:
            await trio.sleep(pause)
        state = get_state()
        peers = holders(state, digest, me)
        source = _hub_source(state, instance, hub)
        try:
            manifest, partial, wanted, report = await _fetch_round(depot, net, instance, shard, peers, source, hub, tied=tied,
                                                                   limits=limits, on_progress=on_progress)
        except (FetchError, HubError) as exc:
            last = exc
            log.warning("shard fetch round failed", instance_id=instance.instance_id, rank=shard.rank,
                        round=attempt + 1, rounds=rounds, error=str(exc))
            continue
        log.info("shard fetched", instance_id=instance.instance_id, rank=shard.rank, model=instance.model_id,
                 bytes=report.bytes_fetched, chunks=report.chunks_fetched, by_peer=report.bytes_by_peer,
                 bad_chunks_by_peer=report.bad_chunks_by_peer)
        if not partial.has(wanted):  # fetched into a newer copy (this one was promoted earlier)
            partial = depot.partial(manifest)
        return await trio.to_thread.run_sync(partial.shard_view, wanted, shard.runner_id)
    assert last is not None
    raise FetchError(f"shard of rank {shard.rank} not fetched after {rounds} rounds: {last}")


async def _fetch_round(depot: ModelDepot, net, instance: Instance, shard: ShardMetadata, peers: list[str],  # type: ignore[no-untyped-def]
                       source: HubSource | None, hub: HubAccess | None, *, tied: bool, limits: FetchLimits,
                       on_progress: Progress | None):
    """One round of ``fetch_shard``: the manifest (from ``peers``, else the hub ``source``),
    then this rank's wanted chunks from ``peers`` (and the hub), the hub's files checked.
    Returns ``(manifest, partial copy, wanted chunks, fetch report)``; raises ``FetchError``
    or ``HubError`` when the round fails."""
    try:
        manifest = await _manifest(depot, net, instance.model_digest, peers)
    except FetchError:
        if source is None:
            raise
        manifest = await hub_manifest(hub, source, depot)  # type: ignore[arg-type]
    client = hub.client(source.repo_id, source.revision) if source is not None and hub is not None else None
    wanted = wanted_chunks(manifest, instance, shard, tied=tied)
    # taken before the fetch: a pull completing this copy meanwhile moves it to
    # pulled/ and this object with it (ModelDepot.promote), a new one would be empty
    partial = depot.partial(manifest)
    report = await _fetch_hub_aware(depot, net, manifest, instance, shard, wanted, peers, client,
                                    tied=tied, limits=limits, on_progress=on_progress)
    if client is not None:
        await verify_files(partial, client)
    return manifest, partial, wanted, report
