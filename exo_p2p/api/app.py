"""``create_app``: the ASGI application of a node's HTTP API (starlette; runs on trio).

Every answer is JSON or SSE (but the dashboard page and its assets, ``exo_p2p.dashboard``): unknown paths are 404, wrong methods 405, request problems 4xx
(OpenAI-shaped errors), and any unexpected exception is logged and answered with a generic
500 JSON — never a traceback page.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from exo_p2p.api.access import AccessGuard, AccessPolicy
from exo_p2p.api.backend import ApiBackend
from exo_p2p.api.body import DEFAULT_MAX_BODY_BYTES
from exo_p2p.api.generation.client_stream import INSTANCE_HEADER
from exo_p2p.api.errors import ApiError, error_info, family_error_response, family_of
from exo_p2p.api.generation.job import GenerationSettings, send_error
from exo_p2p.api.context import ApiConfig
from exo_p2p.api.generation.rejected import rejected_record
from exo_p2p.api.routes import api_routes
from exo_p2p.metrics.observer import Observer
from exo_p2p.metrics.registry import NodeMetrics
from exo_p2p.dashboard import dashboard_routes
from exo_p2p.vision.fetch import ImageUrlPolicy

log = structlog.get_logger("exo_p2p.api")


def create_app(
    backend: ApiBackend,
    *,
    model_aliases: Mapping[str, str] | None = None,
    queue_limit: int | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    generation: GenerationSettings | None = None,
    command_timeout: float = 30.0,
    access: AccessPolicy | None = None,
    extra_routes: Sequence[BaseRoute] = (),
    observer: Observer | None = None,
    reasoning_key: bytes | None = None,
    image_urls: ImageUrlPolicy | None = None,
) -> ASGIApp:
    """The API of one node, serving ``backend``.

    ``model_aliases`` maps names clients may use to model ids; ``queue_limit`` bounds the
    chat completions in flight in this API (beyond it: 429 at once; None = no limit);
    ``max_body_bytes`` bounds request bodies (413); ``generation`` holds the waits of a
    chat completion (seconds); ``command_timeout`` the wait for the master's answer to
    place/delete (seconds); ``access`` the API keys and CORS origins
    (``exo_p2p.api.access``; default: no key, no cross-origin browser access);
    ``extra_routes`` are served too (e.g. a page route named ``dashboard``, which ``GET /``
    serves to browsers; see ``exo_p2p.api.families.ollama.generations``); ``observer`` receives every
    finished request's record and serves ``/metrics`` and ``/requests`` (default: metrics of
    this API alone, no request file); ``reasoning_key`` (32 bytes) seals reasoning carried
    across Responses turns (``exo_p2p.api.families.openai.sealed_reasoning``; default: random);
    ``image_urls`` whether image URLs are fetched (``exo_p2p.vision.fetch``; default: never).
    """
    if queue_limit is not None and queue_limit < 1:
        raise ValueError(f"queue_limit must be >= 1 or None, got {queue_limit}")
    access = access or AccessPolicy()
    config = ApiConfig(
        model_aliases=dict(model_aliases or {}),
        queue_limit=queue_limit,
        max_body_bytes=max_body_bytes,
        generation=generation or GenerationSettings(),
        command_timeout=command_timeout,
        observer=observer or Observer(NodeMetrics(known_model=lambda m: m in backend.state().model_cards)),
    )
    if reasoning_key is not None:
        config.reasoning_key = reasoning_key
    if image_urls is not None:
        config.image_urls = image_urls
    return Starlette(
        routes=[*api_routes(backend, config), *dashboard_routes(), *extra_routes],
        middleware=[
            Middleware(CatchAll),
            Middleware(
                CORSMiddleware,
                allow_origins=list(access.cors_origins),
                allow_methods=["*"],
                allow_headers=["*"],
                expose_headers=["retry-after", "x-should-retry", INSTANCE_HEADER],
                max_age=600,
            ),
            Middleware(AccessGuard, policy=access),
        ],
        exception_handlers={ApiError: _api_error_handler(config.observer), HTTPException: _http_error},
    )


async def _api_error(request: Request, exc: Exception) -> Response:
    """An ``ApiError`` raised in a route as the family's error answer."""
    assert isinstance(exc, ApiError)
    return family_error_response(family_of(request.url.path), exc.info)


def _api_error_handler(observer: Observer) -> Callable[[Request, Exception], Awaitable[Response]]:
    """``_api_error``, and a generation request refused so is recorded too
    (``exo_p2p.api.generation.rejected``); a failure to record is logged, never the answer's."""

    async def handle(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        if observer.active:
            try:
                record = rejected_record(request, exc)
            except Exception:  # noqa: BLE001 - the record goes; the client's answer stays
                log.exception("api.rejected_record_failed", path=request.url.path)
                record = None
            if record is not None:
                observer.finished(record)
        return await _api_error(request, exc)

    return handle


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        info = error_info(404, f"no such endpoint: {request.method} {request.url.path[:200]}", code="not_found")
    elif exc.status_code == 405:
        info = error_info(405, f"method {request.method} is not allowed on {request.url.path[:200]}", code="method_not_allowed")
    else:
        info = error_info(exc.status_code, exc.detail or "request failed")
    return family_error_response(family_of(request.url.path), info, headers=dict(exc.headers or {}))


class CatchAll:
    """ASGI middleware: an exception that escapes a route is logged and answered with a
    generic 500 JSON (if the response has not started), never re-raised into the server.
    A client that went away mid-request is not an error and is only logged at debug."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except ClientDisconnect:
            log.debug("api.client_disconnected", path=scope.get("path"))
        except Exception:
            log.exception("api.unhandled_error", method=scope.get("method"), path=scope.get("path"))
            if not started:
                try:
                    info = error_info(500, "internal error; see the node's log", code="internal_error")
                    await send_error(send, info, family_of(scope.get("path", "")))
                except Exception:  # the connection is gone too
                    log.debug("api.error_response_failed", path=scope.get("path"))
