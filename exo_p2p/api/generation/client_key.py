"""Who a generation request comes from, for the runners' fair share of prefill.

A runner prefills the prompts of different clients round-robin (``worker.engine.fair_share``,
docs/api.md "Fairness between clients"), so one client's ten long prompts do not keep
another's one waiting. The client of a request (``GenerationParams.client``) is:

- ``key:<id>`` when the node requires API keys: the id of the key the request presented
  (``access.key_id``, the first 12 hex digits of its sha256; set by ``AccessGuard``);
- otherwise ``peer:<digest>``: the first 12 hex digits of the sha256 of the caller's address
  and its ``User-Agent`` header, so two tools on one machine (say aider and opencode, each
  with its own user agent) are two clients, and one tool's parallel requests are one.

Without keys the rule is a courtesy, not a guarantee: a caller that varies its user agent
counts as several clients. The key is at most ``CLIENT_KEY_MAX`` characters.
"""

from __future__ import annotations

import hashlib

from starlette.types import Scope

CLIENT_KEY_MAX = 24
"""Characters of a client key at most (``key:`` or ``peer:`` and 12 hex digits)."""


def client_key(scope: Scope) -> str:
    """The client of the request of ``scope`` (an ASGI HTTP scope; see the module docstring)."""
    key_id = (scope.get("state") or {}).get("api_key_id")
    if key_id:
        return f"key:{key_id}"[:CLIENT_KEY_MAX]
    client = scope.get("client")
    host = str(client[0]) if client else ""
    agent = b""
    for name, value in scope.get("headers") or ():
        if name.lower() == b"user-agent":
            agent = value[:256]
            break
    digest = hashlib.sha256(host.encode() + b"\n" + agent).hexdigest()[:12]
    return f"peer:{digest}"
