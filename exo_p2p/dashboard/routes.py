"""Starlette routes serving the dashboard page and its static assets."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).with_name("static")
"""The page's files (installed as package data)."""

ASSET_PREFIX = "/dashboard"
"""Path prefix of the page's assets: ``/dashboard/app.js`` is ``static/app.js``."""

OLLAMA_BANNER = "Ollama is running"
"""What ``GET /`` answers a client that does not ask for HTML: Ollama clients probe ``/``
and expect this text."""

_NO_CACHE = {"Cache-Control": "no-cache"}


def wants_html(request: Request) -> bool:
    """True when the request's ``Accept`` header lists ``text/html`` (a browser navigating)."""
    accept = request.headers.get("accept", "")
    return any(part.split(";", 1)[0].strip().lower() == "text/html" for part in accept.split(","))


class _Assets(StaticFiles):
    """``StaticFiles`` that asks browsers to revalidate (a node upgrade shows at once)."""

    def file_response(self, *args, **kwargs) -> Response:  # type: ignore[override]
        response = super().file_response(*args, **kwargs)
        response.headers.update(_NO_CACHE)
        return response


async def root(request: Request) -> Response:
    """``GET /`` (and ``HEAD /``): the dashboard for browsers (``Accept: text/html``), else
    the plain-text Ollama banner."""
    if wants_html(request):
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers=_NO_CACHE)
    return PlainTextResponse(OLLAMA_BANNER)


def dashboard_routes() -> list[Route | Mount]:
    """The page at ``/`` (route name ``dashboard``) and its assets under ``/dashboard/``."""
    return [
        Route("/", root, methods=["GET"], name="dashboard"),
        Mount(ASSET_PREFIX, app=_Assets(directory=STATIC_DIR), name="dashboard-assets"),
    ]
