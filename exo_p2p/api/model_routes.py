"""Endpoints of models travelling between nodes (docs/models.md).

``POST /models/pull`` (body ``{"model": NAME, "from": NODE|null}``) starts copying a model
another node holds onto this node (201 with its ``PullStatus``; 400 when no node holds it
completely or the name is ambiguous, 409 when it is already here or being pulled, under
this name or, for the same files, another: ``exo_p2p.models.depot.pulls.PullConflict``);
``GET /models/pulls`` lists this node's pulls with their progress; ``GET /models/unsupported``
lists the models this node's stores hold that it cannot serve, each ``{"model", "source",
"path", "reason"}`` (``exo_p2p.models.stores.store.ModelStore.unsupported``); ``GET /models/cluster``
lists every model name held in the cluster with its manifests and holders (complete or
partial); ``DELETE /models/{name}`` removes this node's pulled and fetched copies of a model
(409 while an instance on this node uses it or a pull of it runs; 404 when this node has none; 400 for a name
that cannot name a model directory, ``exo_p2p.models.names.check_model_name``, such as
``..`` or an empty name, which would name the pulled dir itself or one above it).

Bound to a backend with ``pulls`` (``exo_p2p.models.depot.pulls.PullManager``), ``depot``
(``exo_p2p.models.depot.depot.ModelDepot``), ``state()`` and ``node_id``; a backend without them
(test doubles) gets no such routes.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from exo_p2p.api.body import read_body
from exo_p2p.api.errors import ApiError, decode_json
from exo_p2p.api.views import json_response
from exo_p2p.models.names import check_model_name
from exo_p2p.types import State

class PullRequest(msgspec.Struct, frozen=True, rename={"from_node": "from"}):
    model: str
    from_node: str | None = None


def cluster_models(state: State) -> list[dict]:
    """Every (model name, manifest) pair in ``state``'s profiles, grouped by name: ``{"model",
    "manifests": [{"digest", "complete": [node ids], "partial": [node ids]}]}``, sorted (pure).
    One manifest held under two names is listed under each name."""
    by_name: dict[str, dict[str, dict[str, list[str]]]] = {}
    for node_id, profile in sorted(state.nodes.items()):
        for held in profile.held_models:
            entry = by_name.setdefault(held.name, {}).setdefault(held.digest, {"complete": [], "partial": []})
            entry["complete" if held.complete else "partial"].append(node_id)
    return [{"model": name, "manifests": [{"digest": d, **v} for d, v in sorted(m.items())]}
            for name, m in sorted(by_name.items())]


def instances_using(state: State, model: str, node_id: str) -> list[str]:
    """The ids, sorted, of the instances in ``state`` that serve ``model`` with a shard on
    ``node_id`` and have not failed: while any does, this node's copy of ``model`` stays (pure)."""
    return sorted(i for i, inst in state.instances.items() if inst.model_id == model and inst.failed_reason is None
                  and any(s.node_id == node_id for s in inst.shards))


def source_node(backend, name: str | None) -> str | None:  # type: ignore[no-untyped-def]
    """The node id a pull's ``from`` names (``backend.resolve_node``), or None when it names
    none. Raises ``ApiError(400, param="from")`` for an unknown or ambiguous name."""
    if not name:
        return None
    try:
        return backend.resolve_node(name)
    except ValueError as exc:
        raise ApiError(400, str(exc)[:2000], param="from") from None


def model_routes(backend, max_body_bytes: int) -> list[Route]:  # type: ignore[no-untyped-def]
    """The routes above, or none when ``backend`` has no ``pulls``/``depot``."""
    if not (hasattr(backend, "pulls") and hasattr(backend, "depot")):
        return []
    from exo_p2p.models.depot.pulls import PullConflict, PullError

    async def start_pull(request: Request) -> Response:
        req = decode_json(await read_body(request, max_body_bytes), PullRequest)
        from_node = source_node(backend, req.from_node)
        try:
            status = backend.pulls.start(req.model, from_node)
        except PullError as exc:
            code = 409 if isinstance(exc, PullConflict) else 400
            raise ApiError(code, str(exc)[:2000], param="model") from None
        return json_response(status, 201)

    async def list_pulls(request: Request) -> Response:
        return json_response(sorted(backend.pulls.pulls.values(), key=lambda s: s.model))

    async def list_unsupported(request: Request) -> Response:
        problems = backend.depot.store.unsupported()
        return json_response([{"model": p.model_id, "source": p.origin, "path": str(p.path), "reason": p.reason}
                          for p in problems])

    async def list_cluster_models(request: Request) -> Response:
        return json_response(cluster_models(backend.state()))

    async def remove_model(request: Request) -> Response:
        name = request.path_params["name"]
        try:
            check_model_name(name)
        except ValueError as exc:
            raise ApiError(400, str(exc)[:2000], param="model") from None
        using = instances_using(backend.state(), name, backend.node_id)
        if using:
            raise ApiError(409, f"model {name!r} is used by instance(s) {', '.join(using)} on this node; "
                           f"delete them first", param="model")
        pull = backend.pulls.pulls.get(name)
        if pull is not None and pull.state == "running":  # its copy is being written
            raise ApiError(409, f"model {name!r} is being pulled onto this node; wait for the pull "
                           f"to end (GET /models/pulls)", param="model")
        removed = backend.depot.remove(name)
        if not removed:
            raise ApiError(404, f"this node holds no pulled or fetched copy of {name!r} (models in "
                           f"--models-dir dirs are never removed)", param="model")
        backend.depot.refresh()
        await backend.models_changed()
        return json_response({"removed": name, "paths": [str(p) for p in removed]})

    return [
        Route("/models/pull", start_pull, methods=["POST"]),
        Route("/models/pulls", list_pulls, methods=["GET"]),
        Route("/models/cluster", list_cluster_models, methods=["GET"]),
        Route("/models/unsupported", list_unsupported, methods=["GET"]),
        Route("/models/{name:path}", remove_model, methods=["DELETE"]),
    ]
