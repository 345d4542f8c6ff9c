"""The HTTP API of a node: the API families (OpenAI chat, completions and responses, Anthropic
messages, Ollama; ``exo_p2p.api.families``) and the cluster endpoints, behind API keys and
the cross-site refusal of ``exo_p2p.api.access``.

``create_app(backend)`` builds the ASGI app; ``serve(app, host, port)`` runs it on trio with
hypercorn. The node provides the backend (``exo_p2p.api.backend.ApiBackend``).
"""

from exo_p2p.api.app import create_app
from exo_p2p.api.backend import ApiBackend, NodeHealth, NodeSummary
from exo_p2p.api.server import ApiBindError, serve

__all__ = ["ApiBackend", "ApiBindError", "NodeHealth", "NodeSummary", "create_app", "serve"]
