"""The operator's endpoints: ``GET /metrics`` (Prometheus text format) and ``GET /requests``
(the recent records of finished requests; ``exo-p2p logs requests`` polls it). Both need
the API key when keys are set (``--metrics-loopback-open`` lets a scraper on this machine
read ``/metrics`` without one: ``exo_p2p.api.access``). docs/operations.md lists the metrics."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from exo_p2p.api.errors import ApiError
from exo_p2p.metrics.observer import Observer
from exo_p2p.metrics.registry import CONTENT_TYPE
from exo_p2p.metrics.request_log import RECENT

_json = msgspec.json.Encoder()


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"query parameter '{name}' must be an integer, got {raw[:40]!r}", param=name) from None
    if not low <= value <= high:
        raise ApiError(400, f"query parameter '{name}' must be between {low} and {high}, got {value}", param=name)
    return value


def observe_routes(observer: Observer) -> list[Route]:
    """``GET /metrics`` and ``GET /requests?after=N&limit=M`` over ``observer``.

    ``/requests`` answers ``{"records": [RequestRecord…], "last": N}``: the recent records
    numbered after ``after`` (default 0: all kept), oldest first, at most ``limit`` (1–1024,
    default 1024); ``last`` is the number to pass as ``after`` next time. 400 for a
    parameter that is not an integer in range; 404 when that part of the observer is off
    (``--no-metrics``, ``--no-request-records``)."""

    async def metrics(request: Request) -> Response:
        if observer.metrics is None:
            raise ApiError(404, "metrics are off on this node (it runs with --no-metrics)")
        return Response(observer.metrics.exposition(), media_type=CONTENT_TYPE)

    async def requests(request: Request) -> Response:
        if observer.requests is None:
            raise ApiError(404, "request records are off on this node (it runs with --no-request-records)")
        after = _int_param(request, "after", 0, 0, 2**62)
        limit = _int_param(request, "limit", RECENT, 1, RECENT)
        records, last = observer.requests.since(after, limit)
        return Response(_json.encode({"records": records, "last": last}), media_type="application/json")

    return [Route("/metrics", metrics, methods=["GET"]), Route("/requests", requests, methods=["GET"])]
