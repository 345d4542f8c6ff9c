"""Placement on nodes that lack the model: which may fetch it, and the disk their shard needs (docs/models.md).

Rules (pure, from ``State`` and the ``ModelCard``):

- **Holders**: a node holds the model when ``model_id`` is in its ``NodeProfile.models``
  (its own copy), or when it publishes a complete copy of the chosen manifest (a copy it
  fetched earlier); it loads from disk and fetches nothing.
- **Fetchers**: a node that does not hold it may still be a candidate when (a) some node
  publishes a *complete* manifest of the model (``master.model_identity.chosen_digest``:
  a source to fetch from exists), or, when none does, State names a hub source of it
  (``State.hub_models``: the hub is the source), and (b) its profile reports the free disk of its models dir
  (``NodeProfile.models_disk_free``; None, as from nodes before it: not a candidate). The
  memory rule is unchanged (``master.placement.place``).
- **Bytes a rank fetches** (``shard_fetch_bytes``): a pipeline rank the stored bytes of its
  layers plus the non-layer tensors it loads (``master.placement.split.non_layer_bytes_of_rank``:
  the embedding on rank 0, the final norm and head on the last rank); a tensor rank the
  whole model (every rank needs part of every tensor, fetched whole). Config and tokenizer
  files are not in the card and not counted (kilobytes to a few MB). A node with a partial
  copy from an earlier instance is counted as fetching everything of its shard (State does
  not say which chunks it has), so the check errs towards refusing, never towards filling
  a disk.
- **From where** (``fetch_split``): a rank's fetch comes from peers when some node
  publishes a complete copy (or no hub names the model). A model only a hub has whole: a
  single rank or a tensor rank takes everything from the hub; a pipeline rank of several
  the same, except what a lower rank on another node also fetches — the embedding, which
  the last rank of a tied model loads again as its head — which it takes from that rank's
  node (``exo_p2p.models.hub.fetch.shared_chunks``). Partial copies nodes hold of it are
  not counted as peers' (State does not say which chunks they have), so the hub figure is
  the most the hub sends.
- **Disk**: a fetcher's ``models_disk_free`` must be at least ``disk_needed(fetch)`` =
  ``fetch`` plus ``FETCH_DISK_HEADROOM_PERCENT`` (10%, integers rounded up), the same headroom as
  memory.
"""

from __future__ import annotations

from collections.abc import Sequence

from exo_p2p.defaults import disk_needed
from exo_p2p.types import ModelCard, NodeId, Sharding, State
from master.model_identity import chosen_digest
from master.placement.split import non_layer_bytes_of_rank


def holds_model(state: State, node: NodeId, model_id: str) -> bool:
    """Whether ``node`` has a complete copy of ``model_id`` (rule: module docstring)."""
    profile = state.nodes.get(node)
    if profile is None:
        return False
    if model_id in profile.models:
        return True
    digest = fetch_source_digest(state, model_id)
    return digest is not None and any(h.digest == digest and h.complete for h in profile.held_models)


def fetch_source_digest(state: State, model_id: str) -> str | None:
    """The manifest digest a fetcher would fetch (None: no node publishes a complete
    manifest of ``model_id`` and no hub source names one, so nothing can be fetched)."""
    digest = chosen_digest(state, model_id)
    if digest is None and model_id in state.hub_models:
        return state.hub_models[model_id].digest  # read from a hub: its source is the hub
    return digest


def fetcher_problem(state: State, node: NodeId, model_id: str) -> str | None:
    """Why ``node``, which lacks ``model_id``, cannot fetch it; None when it can (rule (a)
    and (b) of the module docstring)."""
    if fetch_source_digest(state, model_id) is None:
        return f"does not hold model {model_id} and no node publishes a complete copy to fetch from (nor a hub)"
    if state.nodes[node].models_disk_free is None:
        return f"does not hold model {model_id} and does not report its free disk"
    return None


def shard_fetch_bytes(card: ModelCard, sharding: Sharding, rank: int, world_size: int,
                      start_layer: int, end_layer: int) -> int:
    """Stored bytes rank ``rank`` of ``world_size`` (layers ``[start_layer, end_layer)``)
    fetches when its node lacks the model (rule: module docstring)."""
    if sharding == "tensor" or world_size == 1:
        return card.storage_size
    layers = sum(card.layer_bytes[start_layer:end_layer])
    return layers + non_layer_bytes_of_rank(card, rank, world_size, sharding)


def disk_problem(state: State, node: NodeId, fetch_bytes: int) -> tuple[int, int] | None:
    """``(need, have)`` free disk bytes when ``node`` cannot store ``fetch_bytes``; None when
    it can (or fetches nothing)."""
    if fetch_bytes <= 0:
        return None
    have = state.nodes[node].models_disk_free or 0
    need = disk_needed(fetch_bytes)
    return (need, have) if have < need else None


def fetch_split(state: State, card: ModelCard, sharding: Sharding, nodes: Sequence[NodeId],
                fetch_bytes: Sequence[int]) -> list[tuple[int, int]]:
    """``(bytes from peers, bytes from the hub)`` per rank of a placement whose rank ``r`` runs
    on ``nodes[r]`` and fetches ``fetch_bytes[r]`` (``shard_fetch_bytes``); each pair sums to
    its rank's fetch (rule "From where": module docstring)."""
    if chosen_digest(state, card.model_id) is not None or card.model_id not in state.hub_models:
        return [(f, 0) for f in fetch_bytes]
    out = []
    last = len(fetch_bytes) - 1
    for rank, fetch in enumerate(fetch_bytes):
        shared = 0
        if (sharding == "pipeline" and 0 < rank == last and card.tie_word_embeddings and fetch_bytes[0] > 0
                and nodes[0] != nodes[rank]):
            shared = min(fetch, card.embedding_bytes)  # the tied head: rank 0's node fetches it first
        out.append((shared, fetch - shared))
    return out
