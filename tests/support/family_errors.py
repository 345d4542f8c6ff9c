"""Reading an error answer in each API family's shape."""

from __future__ import annotations

import httpx


def family_error(response: httpx.Response, status: int) -> tuple[str, str | None]:
    """The message and (OpenAI) param of an error answer, after checking its status and its
    family's shape: OpenAI ``{"error": {message, type, param, code}}``, Anthropic ``{"type":
    "error", "error": {type, message}}``, Ollama ``{"error": "…"}``."""
    assert response.status_code == status, response.text[:500]
    doc = response.json()
    path = response.request.url.path
    if path.startswith("/api/"):
        assert set(doc) == {"error"} and isinstance(doc["error"], str)
        return doc["error"], None
    if path.startswith("/v1/messages"):
        assert doc["type"] == "error" and set(doc["error"]) == {"type", "message"}
        return doc["error"]["message"], doc["error"]["type"]
    assert set(doc["error"]) == {"message", "type", "param", "code"}
    return doc["error"]["message"], doc["error"]["param"]
