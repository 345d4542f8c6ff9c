"""The dashboard: a browser page every node serves on its API port.

The page (``static/``: plain ES modules, no build step, nothing loaded from elsewhere) reads
the same HTTP API the CLI uses — ``GET /state`` and ``GET /instances`` polled every 0.5 s,
``GET /instances/previews``, ``POST /instances``, ``DELETE /instances/{id}`` and streamed
``POST /v1/chat/completions`` — and sends the API key, when the node has one, as
``Authorization: Bearer``. ``dashboard_routes`` serves it: ``GET /`` (the page for browsers,
"Ollama is running" for other clients) and ``GET /dashboard/{file}`` (its assets). Neither
carries cluster data, so both are served without an API key.
"""

from exo_p2p.dashboard.routes import ASSET_PREFIX, STATIC_DIR, dashboard_routes, wants_html

__all__ = ["ASSET_PREFIX", "STATIC_DIR", "dashboard_routes", "wants_html"]
