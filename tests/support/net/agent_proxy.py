"""A logging, steering HTTP proxy between a coding agent's CLI and a node (the agent CLI e2e
tests, docs/agents.md).

It records every request the CLI sends (method, path, JSON body) and forwards it to the node,
streaming the answer back as it comes. A random-weight model cannot choose to call a tool, so
the proxy makes the model's choice for it, through the API's own fields only (the CLI itself
runs unmodified):

- a request whose tools include ``tool`` and that carries no tool result yet gets
  ``tool_choice`` naming that tool, and that tool's schema narrowed to ``args`` (each argument
  one ``const`` value), so the forced call is one the CLI can run;
- a request carrying a tool result gets ``tool_choice`` none, and every answer in text is held
  to ``ANSWER`` (the ``regex`` extension field, docs/api.md), so it ends as a finished turn;
- reasoning is turned off (Anthropic ``thinking`` disabled and ``output_config``'s effort
  dropped, ``reasoning.effort`` / ``reasoning_effort`` none), as a random model's reasoning
  would not end;
- every request's output is capped at ``max_tokens`` (a bound, never reached by the above).

Each family's fields: Anthropic Messages (``tools[].input_schema``, ``tool_choice`` ``tool`` /
``none``, ``tool_result`` blocks), OpenAI Responses (flat ``function`` tools,
``function_call_output`` items, ``max_output_tokens``) and chat completions (nested
``function`` tools, ``role: tool`` messages)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "accept-encoding", "keep-alive"}
"""Request headers not forwarded (httpx sets its own; answers are sent uncompressed)."""

ANSWER = "[A-Z][a-z]{1,8}( [a-z]{1,8}){1,4}\\."
"""The regular expression every text answer is held to: a few words and a full stop, well under
any cap, so the turn ends as the model's own (``end_turn`` / ``stop``), not at ``max_tokens``."""


def _narrowed(schema: dict, args: dict[str, Any]) -> dict:
    """``schema`` with exactly the properties of ``args``, each a ``const``."""
    return {**schema, "type": "object", "properties": {k: {"const": v} for k, v in args.items()},
            "required": list(args), "additionalProperties": False}


def _has_tool_result(body: dict) -> bool:
    for message in body.get("messages") or []:
        if message.get("role") == "tool":
            return True
        content = message.get("content")
        if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            return True
    return any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in body.get("input") or [])


def steer(path: str, body: dict, tool: str, args: dict[str, Any], max_tokens: int) -> dict:
    """``body`` as forwarded to the node (see the module docstring); bodies of other paths and
    of requests without that tool pass unchanged except for the output cap."""
    body = dict(body)
    responses = path.startswith("/v1/responses")
    anthropic = path.startswith("/v1/messages") and "count_tokens" not in path
    if "count_tokens" in path:
        return body
    cap = "max_output_tokens" if responses else "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    body[cap] = min(int(body.get(cap) or max_tokens), max_tokens)
    # no reasoning (the tiny model's would run to the cap): each family's switch (docs/api.md)
    if anthropic:
        body["thinking"] = {"type": "disabled"}
        body.pop("output_config", None)
    elif responses:
        body["reasoning"] = {**(body.get("reasoning") or {}), "effort": "none"}
    else:
        body["reasoning_effort"] = "none"
    tools = body.get("tools") or []
    names = [t.get("name") or (t.get("function") or {}).get("name") for t in tools]
    if tool not in names or _has_tool_result(body):
        body["regex"] = ANSWER  # a short answer that ends (a tiny model's text would run to the cap)
        if tool in names:
            body["tool_choice"] = {"type": "none"} if anthropic else "none"
        return body
    index = names.index(tool)
    spec = dict(tools[index])
    if anthropic:
        spec["input_schema"] = _narrowed(spec.get("input_schema") or {}, args)
        body["tool_choice"] = {"type": "tool", "name": tool, "disable_parallel_tool_use": True}
    elif responses:
        spec["parameters"] = _narrowed(spec.get("parameters") or {}, args)
        body["tool_choice"] = {"type": "function", "name": tool}
    else:
        spec["function"] = {**spec["function"], "parameters": _narrowed(spec["function"].get("parameters") or {}, args)}
        body["tool_choice"] = {"type": "function", "function": {"name": tool}}
    if not anthropic:
        body["parallel_tool_calls"] = False  # one call, not calls until the cap
    body["tools"] = [*tools[:index], spec, *tools[index + 1:]]
    return body


class AgentProxy:
    """A proxy on 127.0.0.1 (``url``) to ``upstream``, steering calls to ``tool`` with ``args``;
    ``requests`` lists ``(method, path, body)`` as the CLI sent them. Use as a context manager."""

    def __init__(self, upstream: str, tool: str, args: dict[str, Any], max_tokens: int = 256, timeout: float = 300) -> None:
        self.upstream, self.tool, self.args, self.max_tokens = upstream, tool, args, max_tokens
        self.requests: list[tuple[str, str, Any]] = []
        self.answers: list[tuple[int, str]] = []
        """Each forwarded request's status and, for an error or a failure to forward, its text."""
        self._client = httpx.Client(base_url=upstream, timeout=timeout)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="agent-proxy", daemon=True)

    def __enter__(self) -> "AgentProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()
        self._thread.join(timeout=10)

    def bodies(self, path_prefix: str) -> list[dict]:
        """The JSON bodies the CLI sent to paths starting with ``path_prefix``."""
        return [b for _, p, b in self.requests if p.startswith(path_prefix) and isinstance(b, dict)]

    def _forward(self, handler: BaseHTTPRequestHandler) -> None:
        raw = handler.rfile.read(int(handler.headers.get("content-length") or 0))
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        self.requests.append((handler.command, handler.path, body))
        if isinstance(body, dict):
            raw = json.dumps(steer(handler.path.split("?")[0], body, self.tool, self.args, self.max_tokens)).encode()
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP_HEADERS}
        request = self._client.build_request(handler.command, handler.path, content=raw or None, headers=headers)
        try:
            self._relay(handler, request)
        except Exception as e:  # recorded for the test's report, then the CLI sees its connection drop
            self.answers.append((0, repr(e)))
            raise

    def _relay(self, handler: BaseHTTPRequestHandler, request: httpx.Request) -> None:
        answer = self._client.send(request, stream=True)
        try:
            if answer.status_code >= 400:
                answer.read()
                self.answers.append((answer.status_code, answer.text[:2000]))
            else:
                self.answers.append((answer.status_code, ""))
            handler.send_response(answer.status_code)
            for key, value in answer.headers.items():
                if key.lower() not in HOP_HEADERS | {"content-encoding"}:
                    handler.send_header(key, value)
            handler.send_header("connection", "close")
            handler.end_headers()
            for chunk in [answer.content] if answer.is_stream_consumed else answer.iter_raw():
                handler.wfile.write(chunk)
                handler.wfile.flush()
        finally:
            answer.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the answer's end is the connection's close

            def do_GET(self) -> None:
                proxy._forward(self)

            do_POST = do_HEAD = do_DELETE = do_GET

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler
