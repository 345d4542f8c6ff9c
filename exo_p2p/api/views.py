"""Pure conversions from State and node facts to the JSON documents of the cluster endpoints,
and ``json_response``, the response that carries them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
from starlette.responses import Response

from exo_p2p.api.backend import NodeHealth
from exo_p2p.api.schemas import InstanceOut, LocalModel, ModelEntry, ModelList, ShardView
from exo_p2p.models.card.families import shardings_of
from exo_p2p.state import InstanceView, state_hash
from exo_p2p.types import InstanceUsage, ModelCard, State
from exo_p2p.types.kinds import card_tasks

OWNED_BY = "exo-p2p"
_json = msgspec.json.Encoder()


def json_response(value: object, status: int = 200) -> Response:
    """``value`` (Structs, dicts, lists) encoded by msgspec as a JSON response."""
    return Response(_json.encode(value), status_code=status, media_type="application/json")


def instance_out(view: InstanceView, usage: InstanceUsage | None = None) -> InstanceOut:
    """The ``/instances`` shape of an instance view; shard ``status`` is its runner's status
    tag (``pending`` before the runner reported); its keep-alive from ``usage`` (``State.usage``)."""
    inst = view.instance
    downloads = list(view.downloads) + [None] * (len(inst.shards) - len(view.downloads))
    shards = [
        ShardView(
            node_id=s.node_id,
            runner_id=s.runner_id,
            rank=s.rank,
            start_layer=s.start_layer,
            end_layer=s.end_layer,
            share_bytes=s.share_bytes,
            status=view.runner_statuses[i] if i < len(view.runner_statuses) else "pending",
            weights_dtype=s.weights_dtype,
            bytes_done=downloads[i].bytes_done if downloads[i] else None,
            bytes_total=downloads[i].bytes_total if downloads[i] else None,
            bytes_per_second=downloads[i].bytes_per_second if downloads[i] else None,
            bytes_from_peers=downloads[i].bytes_from_peers if downloads[i] else None,
            bytes_from_hub=downloads[i].bytes_from_hub if downloads[i] else None,
        )
        for i, s in enumerate(inst.shards)
    ]
    return InstanceOut(
        instance_id=inst.instance_id,
        model=inst.model_id,
        sharding=inst.sharding,
        status=view.status,
        reason=view.reason,
        layers_loaded=view.layers_loaded,
        layers_total=view.layers_total,
        shards=shards,
        bytes_downloaded=sum(d.bytes_done for d in downloads if d),
        bytes_to_download=sum(d.bytes_total for d in downloads if d),
        bytes_from_peers=sum(d.bytes_from_peers for d in downloads if d),
        bytes_from_hub=sum(d.bytes_from_hub for d in downloads if d),
        **({} if usage is None else {"keep_alive": usage.keep_alive, "last_used": usage.last_used, "expires_at": usage.expires_at,
                                     "pinned": usage.pinned, "on_demand": usage.on_demand}),
    )


def model_entry(card: ModelCard, created: int) -> ModelEntry:
    """``GET /v1/models/{id}`` (and each entry of ``GET /v1/models``); ``created`` in Unix
    seconds."""
    return ModelEntry(
        id=card.model_id,
        object="model",
        created=created,
        owned_by=OWNED_BY,
        n_layers=card.n_layers,
        storage_size=card.storage_size,
        context_length=card.context_length,
        tasks=list(card_tasks(card)),
        capabilities=list(card.capabilities),
    )


def model_list(cards: Iterable[ModelCard], created: int) -> ModelList:
    """``GET /v1/models``: every model card the cluster knows, sorted by id; ``created`` is
    Unix seconds (the cards carry no date, so the API's start time is used)."""
    return ModelList(object="list", data=[model_entry(c, created) for c in sorted(cards, key=lambda c: c.model_id)])


def local_model(card: ModelCard, source: str | None = None) -> LocalModel:
    """``GET /models`` entry of a model this node holds (bytes, tokens; family, quantization
    and shardings: ``exo_p2p.models.card.families``); ``source``: where the store found it
    (``exo_p2p.models.stores.sources.Origin``; None: not known)."""
    shardings, notes = shardings_of(card.architecture, supports_tensor=card.supports_tensor)
    return LocalModel(
        model=card.model_id,
        n_layers=card.n_layers,
        storage_size=card.storage_size,
        hidden_size=card.hidden_size,
        num_attention_heads=card.num_attention_heads,
        num_key_value_heads=card.num_key_value_heads,
        context_length=card.context_length,
        source=source,
        family=card.architecture,
        quantization=card.quantization,
        shardings=shardings,
        sharding_notes=notes,
        tasks=list(card_tasks(card)),
        capabilities=list(card.capabilities),
    )


def state_document(state: State, health: NodeHealth) -> dict[str, Any]:
    """``GET /state``: the replicated State as plain JSON values plus ``last_event_idx``,
    ``term``, ``state_hash`` (docs/architecture.md#log-guarantees) and the node-local ``node_id``, ``master``,
    ``warnings``, ``counters`` and ``mdns`` (whether it uses mDNS; None: not said) (not part of the hash)."""
    doc: dict[str, Any] = msgspec.to_builtins(state)
    doc.update(
        last_event_idx=state.last_event_idx,
        term=state.term,
        state_hash=state_hash(state),
        node_id=health.node_id,
        master=health.master,
        warnings=list(health.warnings),
        counters=dict(health.counters),
        mdns=health.mdns,
    )
    return doc


def parse_nodes(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """Node names from ``"a,b"`` or ``["a", "b,c"]``: split on commas, stripped, empties
    dropped, order kept."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else list(value)
    return tuple(part.strip() for item in items for part in item.split(",") if part.strip())
