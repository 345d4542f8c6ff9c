"""The endpoints of the HTTP API, as starlette routes bound to one ``ApiBackend``.

Generations: the routes of each family in ``exo_p2p.api.families`` (OpenAI chat,
completions and responses, Anthropic messages, Ollama), all answered through
``exo_p2p.api.generation``; ``GET /v1/models/{id}``. Cluster:
``GET /v1/models``, ``GET /models``, ``GET /state``, ``GET /nodes``, ``GET|POST /instances``,
``GET /instances/previews``, ``GET|DELETE /instances/{id}``, ``GET /health`` (no key
needed). Debug: ``GET /debug/event-times`` (``ApiBackend.event_times``). Errors are raised
as ``ApiError`` and answered in the route's family error shape by the app's handler.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from exo_p2p.api.backend import ApiBackend
from exo_p2p.api.body import read_body
from exo_p2p.api.bounds import check_command_size, node_filter
from exo_p2p.api.context import ApiConfig, ApiContext
from exo_p2p.api.errors import ApiError, decode_json, error_response
from exo_p2p.api.families import anthropic, ollama, openai_chat, openai_completions, openai_responses
from exo_p2p.api.model_routes import model_routes
from exo_p2p.api.schemas import PlaceRequest
from exo_p2p.api.views import instance_out, local_model, model_entry, model_list, state_document
from exo_p2p.state import instance_view
from exo_p2p.types import DeleteInstance, InstanceId, ModelId, PlaceInstance, new_id

_json = msgspec.json.Encoder()


def json_response(value: object, status: int = 200) -> Response:
    """``value`` (Structs, dicts, lists) encoded by msgspec as a JSON response."""
    return Response(_json.encode(value), status_code=status, media_type="application/json")


__all__ = ["ApiConfig", "api_routes", "json_response"]


def api_routes(backend: ApiBackend, config: ApiConfig) -> list[Route]:
    """The routes of the API, bound to ``backend`` (closures; no global state)."""
    ctx = ApiContext(backend, config)
    started = ctx.started
    config.observer.attach_api(lambda: ctx.inflight.count, lambda: (ctx.moves.moved, ctx.moves.failed))

    def _model_id(name: str) -> ModelId:
        return ctx.model_id(name)

    async def health(request: Request) -> Response:
        return json_response({"status": "ok", "node_id": backend.node_id})

    async def list_models(request: Request) -> Response:
        return json_response(model_list(backend.state().model_cards.values(), started))

    async def get_model(request: Request) -> Response:
        name = request.path_params["model_id"]
        card = ctx.card(name)
        if card is None:
            raise ApiError(404, f"The model `{name[:200]}` does not exist in this cluster", param="model", code="model_not_found")
        return json_response(model_entry(card, started))

    async def list_local_models(request: Request) -> Response:
        # where each was found (docs/models.md#model-stores); a backend without a depot: unknown
        origins = backend.depot.store.origins() if hasattr(backend, "depot") else {}  # type: ignore[attr-defined]
        cards = sorted(backend.local_models(), key=lambda c: c.model_id)
        return json_response([local_model(c, origins.get(c.model_id)) for c in cards])

    async def get_state(request: Request) -> Response:
        health = backend.health()
        moves = {"requests_moved": ctx.moves.moved, "requests_move_failed": ctx.moves.failed}
        health = msgspec.structs.replace(health, counters={**health.counters, **moves})
        return json_response(state_document(backend.state(), health))

    async def list_nodes(request: Request) -> Response:
        return json_response(backend.nodes())

    async def list_instances(request: Request) -> Response:
        state = backend.state()
        views = [instance_out(instance_view(state, inst)) for _, inst in sorted(state.instances.items())]
        return json_response(views)

    async def get_instance(request: Request) -> Response:
        instance_id = request.path_params["instance_id"]
        state = backend.state()
        inst = state.instances.get(instance_id)
        if inst is None:
            raise ApiError(404, f"instance '{instance_id[:100]}' not found", param="instance_id")
        return json_response(instance_out(instance_view(state, inst)))

    async def place_instance(request: Request) -> Response:
        body = await read_body(request, config.max_body_bytes)
        req = decode_json(body, PlaceRequest)
        command = PlaceInstance(
            command_id=new_id(),
            model_id=_model_id(req.model),
            min_nodes=req.min_nodes,
            sharding=req.sharding,
            nodes=node_filter(req.nodes),
        )
        check_command_size(command)
        result = await backend.command(command, timeout=config.command_timeout)
        if result.error is not None:
            return error_response(result.error)
        if result.instance is None:
            raise ApiError(500, "the master accepted the placement but returned no instance")
        state = backend.state()
        inst = state.instances.get(result.instance.instance_id, result.instance)
        return json_response(instance_out(instance_view(state, inst)), status=201)

    async def delete_instance(request: Request) -> Response:
        instance_id = InstanceId(request.path_params["instance_id"])
        result = await backend.command(DeleteInstance(command_id=new_id(), instance_id=instance_id), timeout=config.command_timeout)
        if result.error is not None:
            return error_response(result.error)
        return json_response({"deleted": instance_id})

    async def previews(request: Request) -> Response:
        model = request.query_params.get("model")
        if not model:
            raise ApiError(400, "query parameter 'model' is required", param="model")
        nodes = node_filter(request.query_params.getlist("nodes") or None)
        model_id = _model_id(model)
        if ctx.card(model) is None:  # a hub repo nobody read yet: its card first (docs/models.md)
            model_id, error = await backend.read_from_hub(model_id)
            if error is not None:
                return error_response(error)
        try:
            found = backend.previews(ModelId(model_id), nodes)
        except KeyError:
            raise ApiError(404, f"model '{model[:200]}' is not known to the cluster", param="model", code="model_not_found") from None
        except ValueError as exc:  # a required node that is unknown or ambiguous
            raise ApiError(400, str(exc)[:2000], param="nodes") from None
        return json_response(found)

    async def event_times(request: Request) -> Response:
        try:
            since = int(request.query_params.get("since", "0"))
        except ValueError:
            raise ApiError(400, "query parameter 'since' must be an integer event index", param="since") from None
        view = backend.event_times(since)
        if view is None:
            raise ApiError(404, "this node records no event times", code="not_found")
        return json_response(view)

    return [
        *openai_chat.routes(ctx),
        *openai_completions.routes(ctx),
        *openai_responses.routes(ctx),
        *anthropic.routes(ctx),
        *ollama.routes(ctx),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", get_model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/models", list_local_models, methods=["GET"]),
        Route("/state", get_state, methods=["GET"]),
        Route("/nodes", list_nodes, methods=["GET"]),
        Route("/instances", list_instances, methods=["GET"]),
        Route("/instances", place_instance, methods=["POST"]),
        Route("/instances/previews", previews, methods=["GET"]),
        Route("/instances/{instance_id}", get_instance, methods=["GET"]),
        Route("/instances/{instance_id}", delete_instance, methods=["DELETE"]),
        Route("/debug/event-times", event_times, methods=["GET"]),
        *model_routes(backend, config.max_body_bytes),  # models travel between nodes (docs/models.md)
    ]
