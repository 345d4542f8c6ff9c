"""Endpoints of instances: ``GET|POST /instances``, ``GET /instances/previews``,
``GET|DELETE /instances/{id}``.

Placing and deleting are commands to the master (``PlaceInstance``, ``DeleteInstance``),
answered in the master's error shape when refused; reads come from this node's State.
Errors are raised as ``ApiError`` and answered by the app's handler.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from exo_p2p.api.body import read_body
from exo_p2p.api.bounds import check_command_size, node_filter
from exo_p2p.api.context import ApiContext
from exo_p2p.api.disconnect import until_disconnect
from exo_p2p.api.errors import ApiError, decode_json, error_response
from exo_p2p.api.demand.preload import request_keep_alive
from exo_p2p.api.schemas import InstanceOut, PlaceRequest
from exo_p2p.api.views import instance_out, json_response
from exo_p2p.state import instance_view
from exo_p2p.types import DeleteInstance, Instance, InstanceId, ModelId, PlaceInstance, State, new_id


def instance_routes(ctx: ApiContext) -> list[Route]:
    """The instance routes, bound to ``ctx`` (closures; no global state). ``/instances/previews``
    comes before ``/instances/{instance_id}``, which would otherwise take it."""
    backend, config = ctx.backend, ctx.config

    async def list_instances(request: Request) -> Response:
        state = backend.state()
        views = [_out(state, inst) for _, inst in sorted(state.instances.items())]
        return json_response(views)

    async def get_instance(request: Request) -> Response:
        instance_id = request.path_params["instance_id"]
        state = backend.state()
        inst = state.instances.get(instance_id)
        if inst is None:
            raise ApiError(404, f"instance '{instance_id[:100]}' not found", param="instance_id")
        return json_response(_out(state, inst))

    async def place_instance(request: Request) -> Response:
        body = await read_body(request, config.max_body_bytes)
        req = decode_json(body, PlaceRequest)
        command = PlaceInstance(
            command_id=new_id(),
            model_id=ctx.model_id(req.model),
            min_nodes=req.min_nodes,
            sharding=req.sharding,
            nodes=node_filter(req.nodes),
            keep_alive=request_keep_alive(req.keep_alive),
            pin=req.pin, split=req.split,
        )
        check_command_size(command)
        if ctx.card(req.model) is None:  # may read a hub: stopped when the client leaves
            result = await until_disconnect(request, backend.command, command, config.command_timeout)
        else:
            result = await backend.command(command, timeout=config.command_timeout)
        if result.error is not None:
            return error_response(result.error)
        if result.instance is None:
            raise ApiError(500, "the master accepted the placement but returned no instance")
        state = backend.state()
        inst = state.instances.get(result.instance.instance_id, result.instance)
        return json_response(_out(state, inst), status=201)

    async def delete_instance(request: Request) -> Response:
        instance_id = InstanceId(request.path_params["instance_id"])
        result = await backend.command(DeleteInstance(command_id=new_id(), instance_id=instance_id), timeout=config.command_timeout)
        if result.error is not None:
            return error_response(result.error)
        return json_response({"deleted": instance_id})

    async def previews(request: Request) -> Response:
        return await placement_previews(ctx, request)

    return [
        Route("/instances", list_instances, methods=["GET"]),
        Route("/instances", place_instance, methods=["POST"]),
        Route("/instances/previews", previews, methods=["GET"]),
        Route("/instances/{instance_id}", get_instance, methods=["GET"]),
        Route("/instances/{instance_id}", delete_instance, methods=["DELETE"]),
    ]


async def placement_previews(ctx: ApiContext, request: Request) -> Response:
    """``GET /instances/previews?model=M&nodes=…``: the placements the master would consider
    for ``M`` (``ApiBackend.previews``). A hub repo no node has read yet gets its card read
    first, for this node only (docs/models.md; never into State; abandoned when the client
    leaves). 400 without ``model`` or for a required node that is unknown or
    ambiguous; 404 for a model the cluster does not know."""
    model = request.query_params.get("model")
    if not model:
        raise ApiError(400, "query parameter 'model' is required", param="model")
    nodes = node_filter(request.query_params.getlist("nodes") or None)
    model_id = ctx.model_id(model)
    if ctx.card(model) is None:  # a hub repo nobody read yet: its card first (docs/models.md)
        model_id, error = await until_disconnect(request, ctx.backend.read_from_hub, model_id)
        if error is not None:
            return error_response(error)
    try:
        found = ctx.backend.previews(ModelId(model_id), nodes)
    except KeyError:
        raise ApiError(404, f"model '{model[:200]}' is not known to the cluster", param="model", code="model_not_found") from None
    except ValueError as exc:  # a required node that is unknown or ambiguous
        raise ApiError(400, str(exc)[:2000], param="nodes") from None
    return json_response(found)


def _out(state: State, inst: Instance) -> InstanceOut:
    """``inst`` as ``/instances`` shows it, with its keep-alive (``State.usage``)."""
    return instance_out(instance_view(state, inst), state.usage.get(inst.instance_id))
