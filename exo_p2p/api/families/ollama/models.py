"""Ollama's model endpoints: which model an Ollama client means, ``/api/tags``, ``/api/ps``,
``/api/show`` and ``/api/version``, in Ollama's shapes (``exo_p2p.api.families.ollama.generations``
has the generations).

A name the cluster does not know is looked up as an Ollama store's model (``llama3.2`` ->
``ollama:llama3.2:latest``, docs/models.md#model-stores). Times are Ollama's RFC 3339 with
microseconds (``timestamp``); digests are the sha256 of the model id.
"""

from __future__ import annotations

import hashlib
import time
from datetime import datetime, timezone
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from exo_p2p.api.context import ApiContext
from exo_p2p.api.demand.aliases import alias_cards
from exo_p2p.api.errors import ApiError
from exo_p2p.api.families.ollama.params import ShowRequest
from exo_p2p.models.names import OLLAMA_PREFIX
from exo_p2p.state import instance_view
from exo_p2p.state.usage import model_expiry
from exo_p2p.types import ModelCard, ModelId

OLLAMA_VERSION = "0.12.0"
"""The Ollama version ``/api/version`` reports (clients check for a recent enough one)."""
_json = msgspec.json.Encoder()


FOREVER = "2999-01-01T00:00:00Z"
"""``/api/ps``'s ``expires_at`` of a model kept loaded until deleted."""


def timestamp(unix: float | None = None) -> str:
    """RFC 3339 UTC with microseconds, as Ollama's ``created_at``."""
    moment = datetime.fromtimestamp(time.time() if unix is None else unix, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _digest(model_id: str) -> str:
    return hashlib.sha256(model_id.encode()).hexdigest()


def _details(card: ModelCard) -> dict[str, Any]:
    arch = card.architecture or ""
    return {"parent_model": "", "format": "mlx", "family": arch, "families": [arch] if arch else None, "parameter_size": "",
            "quantization_level": card.quantization}


def _entry(card: ModelCard, modified: str) -> dict[str, Any]:
    return {"name": card.model_id, "model": card.model_id, "modified_at": modified, "size": card.storage_size,
            "digest": _digest(card.model_id), "details": _details(card)}


def _json_response(doc: Any) -> Response:
    return Response(_json.encode(doc), media_type="application/json")


def meant(ctx: ApiContext, name: str) -> ModelId:
    """The model an Ollama client means: ``name`` when the cluster knows it, else the Ollama
    store's model of that name (``llama3.2`` -> ``ollama:llama3.2:latest``,
    docs/models.md#model-stores), else ``name`` (404 later)."""
    given = ctx.model_id(name)
    cards = ctx.backend.state().model_cards
    if given in cards or name.startswith(OLLAMA_PREFIX):
        return given
    store = ctx.model_id(OLLAMA_PREFIX + name)
    return store if store in cards else given


def known(ctx: ApiContext, model: str) -> ModelCard:
    """The card of the model ``model`` means (``meant``). Raises ``ApiError(404)`` when the
    cluster has none."""
    card = ctx.card(meant(ctx, model))
    if card is None:
        raise ApiError(404, f"model '{model[:200]}' not found", param="model", code="model_not_found")
    return card


def model_routes(ctx: ApiContext) -> list[Route]:
    """``GET /api/tags``, ``GET /api/ps``, ``POST /api/show``, ``GET /api/version``."""

    async def tags(request: Request) -> Response:
        modified = timestamp(ctx.started)
        state = ctx.backend.state()  # the models and the cluster's aliases (exo_p2p.api.demand.aliases)
        cards = sorted([*state.model_cards.values(), *alias_cards(state, ctx.backend.node_id)], key=lambda c: c.model_id)
        return _json_response({"models": [_entry(c, modified) for c in cards]})

    async def ps(request: Request) -> Response:
        state = ctx.backend.state()
        ready = sorted({inst.model_id for inst in state.instances.values() if instance_view(state, inst).status == "ready"})
        models = []
        for model_id in ready:
            card = state.model_cards.get(model_id)
            if card is None:
                continue
            until = model_expiry(state, model_id)  # the keep-alive deadline (exo_p2p.state.usage); None: forever
            expires = FOREVER if until is None else timestamp(until)
            entry = _entry(card, timestamp(ctx.started))
            entry.pop("modified_at")
            models.append({**entry, "expires_at": expires, "size_vram": 0, "context_length": card.context_length})
        return _json_response({"models": models})

    async def show(request: Request) -> Response:
        r = await ctx.read_json(request, ShowRequest)
        name = r.model or r.name
        if not name:
            raise ApiError(400, "model is required", param="model")
        return _json_response(show_document(known(ctx, name), ctx.started))

    async def version(request: Request) -> Response:
        return _json_response({"version": OLLAMA_VERSION})

    return [
        Route("/api/tags", tags, methods=["GET"]),
        Route("/api/ps", ps, methods=["GET"]),
        Route("/api/show", show, methods=["POST"]),
        Route("/api/version", version, methods=["GET"]),
    ]


def show_document(card: ModelCard, started: int) -> dict[str, Any]:
    """``/api/show``'s answer for ``card``: its shape as Ollama's ``model_info`` keys under
    its architecture (``<arch>.context_length`` in tokens, where clients read the context
    window; widths, layers, heads, vocabulary), its ``capabilities`` from its chat template
    (``exo_p2p.models.card.capabilities``; ``completion`` for a card from before them);
    ``started`` (Unix seconds) is its ``modified_at`` (pure)."""
    arch = card.architecture or "llama"
    info: dict[str, Any] = {"general.architecture": arch}
    info.update({
        f"{arch}.context_length": card.context_length,
        f"{arch}.embedding_length": card.hidden_size,
        f"{arch}.block_count": card.n_layers,
        f"{arch}.attention.head_count": card.num_attention_heads,
        f"{arch}.attention.head_count_kv": card.num_key_value_heads,
        f"{arch}.vocab_size": card.vocab_size,
    })
    return {
        "modelfile": "", "parameters": "", "template": "", "details": _details(card), "model_info": info,
        "capabilities": list(card.capabilities or ("completion",)), "modified_at": timestamp(started),
    }
