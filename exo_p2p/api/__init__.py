"""The HTTP API of a node: OpenAI chat completions and the cluster endpoints (design.md §1).

``create_app(backend)`` builds the ASGI app; ``serve(app, host, port)`` runs it on trio with
hypercorn. The node provides the backend (``exo_p2p.api.backend.ApiBackend``).
"""

from exo_p2p.api.app import create_app
from exo_p2p.api.backend import ApiBackend, NodeHealth, NodeSummary
from exo_p2p.api.server import ApiBindError, serve

__all__ = ["ApiBackend", "ApiBindError", "NodeHealth", "NodeSummary", "create_app", "serve"]
