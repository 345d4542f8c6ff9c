"""The endpoints of the HTTP API, as starlette routes bound to one ``ApiBackend``:
``api_routes`` is the one list of them (a new endpoint is registered there).

Generations: the routes of each family in ``exo_p2p.api.families`` (OpenAI chat,
completions and responses, Anthropic messages, Ollama), all answered through
``exo_p2p.api.generation.path``; ``GET /v1/models/{id}``. Cluster:
``GET /v1/models``, ``GET /models``, ``GET /state``, ``GET /nodes``, ``GET /health`` (no key
needed); instances: ``exo_p2p.api.instance_routes``; models travelling between nodes:
``exo_p2p.api.model_routes``. Debug: ``GET /debug/event-times`` (``ApiBackend.event_times``).
Operator: ``GET /metrics``, ``GET /requests`` (``exo_p2p.api.observe_routes``).
Errors are raised as ``ApiError`` and answered in the route's family error shape by the
app's handler.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from exo_p2p.api.backend import ApiBackend
from exo_p2p.api.context import ApiConfig, ApiContext
from exo_p2p.api import embed_routes
from exo_p2p.api.demand.aliases import alias_cards
from exo_p2p.api.images.routes import routes as image_routes
from exo_p2p.api.errors import ApiError
from exo_p2p.api.families.anthropic import messages as anthropic
from exo_p2p.api.families.ollama import generations as ollama
from exo_p2p.api.families.openai import chat as openai_chat
from exo_p2p.api.families.openai import completions as openai_completions
from exo_p2p.api.families.openai import responses as openai_responses
from exo_p2p.api.instance_routes import instance_routes
from exo_p2p.api.model_routes import model_routes
from exo_p2p.api.observe_routes import observe_routes
from exo_p2p.api.views import json_response, local_model, model_entry, model_list, state_document

__all__ = ["ApiConfig", "api_routes"]


def api_routes(backend: ApiBackend, config: ApiConfig) -> list[Route]:
    """The routes of the API, bound to ``backend`` (closures; no global state)."""
    ctx = ApiContext(backend, config)
    demand = config.generation.demand  # placements on demand by outcome (exo_p2p.api.demand.placer)
    config.observer.attach_api(lambda: ctx.inflight.count, lambda: (ctx.moves.moved, ctx.moves.failed),
                               lambda: dict(demand.outcomes) if demand is not None else {})
    return [
        *openai_chat.routes(ctx),
        *openai_completions.routes(ctx),
        *openai_responses.routes(ctx),
        *anthropic.routes(ctx),
        *ollama.routes(ctx),
        *embed_routes.routes(ctx),  # embeddings and rerank (docs/api.md#embeddings-and-reranking)
        *image_routes(ctx),  # OpenAI's images API (docs/images.md#api)
        *cluster_routes(ctx),
        *instance_routes(ctx),
        *debug_routes(backend),
        *model_routes(backend, config.max_body_bytes),  # models travel between nodes (docs/models.md)
        *observe_routes(config.observer),
    ]


def cluster_routes(ctx: ApiContext) -> list[Route]:
    """The cluster's read-only routes: its models (``/v1/models``, ``/v1/models/{id}``, this
    node's ``/models``), ``/state``, ``/nodes`` and ``/health``."""
    backend, started = ctx.backend, ctx.started

    async def health(request: Request) -> Response:
        return json_response({"status": "ok", "node_id": backend.node_id})

    async def list_models(request: Request) -> Response:
        state = backend.state()  # the models, then the cluster's aliases (exo_p2p.api.demand.aliases)
        return json_response(model_list([*state.model_cards.values(), *alias_cards(state, backend.node_id)], started))

    async def get_model(request: Request) -> Response:
        name = request.path_params["model_id"]
        card = ctx.card(name)
        if card is None:
            raise ApiError(404, f"unknown model {name[:200]}", param="model", code="model_not_found")
        return json_response(model_entry(card, started))

    async def list_local_models(request: Request) -> Response:
        # where each was found (docs/models.md#model-stores); a backend without a depot: unknown
        origins = backend.depot.store.origins() if hasattr(backend, "depot") else {}  # type: ignore[attr-defined]
        cards = sorted(backend.local_models(), key=lambda c: c.model_id)
        return json_response([local_model(c, origins.get(c.model_id)) for c in cards])

    async def get_state(request: Request) -> Response:
        health = backend.health()
        moves = {"requests_moved": ctx.moves.moved, "requests_move_failed": ctx.moves.failed}
        if (demand := ctx.config.generation.demand) is not None:  # exo_p2p.api.demand.placer
            moves["placements_on_demand"] = demand.placed
        health = msgspec.structs.replace(health, counters={**health.counters, **moves})
        return json_response(state_document(backend.state(), health))

    async def list_nodes(request: Request) -> Response:
        return json_response(backend.nodes())

    return [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", get_model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/models", list_local_models, methods=["GET"]),
        Route("/state", get_state, methods=["GET"]),
        Route("/nodes", list_nodes, methods=["GET"]),
    ]


def debug_routes(backend: ApiBackend) -> list[Route]:
    """``GET /debug/event-times?since=IDX``: when this node published, received and applied
    the events from index ``IDX`` on (``ApiBackend.event_times``); 400 for a ``since`` that is not an integer, 404 when this
    node records no event times."""

    async def event_times(request: Request) -> Response:
        try:
            since = int(request.query_params.get("since", "0"))
        except ValueError:
            raise ApiError(400, "query parameter 'since' must be an integer event index", param="since") from None
        view = backend.event_times(since)
        if view is None:
            raise ApiError(404, "this node records no event times", code="not_found")
        return json_response(view)

    return [Route("/debug/event-times", event_times, methods=["GET"])]
