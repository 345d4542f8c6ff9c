"""Ollama's native API: ``/api/chat``, ``/api/generate`` (NDJSON streams), and ``HEAD /`` /
``GET /`` ("Ollama is running", which clients probe); ``/api/tags``, ``/api/ps``,
``/api/show`` and ``/api/version`` are ``exo_p2p.api.families.ollama.models``'.

A ``model`` the cluster does not know by that name is looked up as an Ollama store's model
(``llama3.2`` -> ``ollama:llama3.2:latest``, docs/models.md#model-stores), so a client that
names models as ``ollama list`` does finds them; ``/api/tags`` lists them as ``ollama:…``.
``stream`` defaults to true, as in Ollama. ``options`` map to ours: ``temperature``,
``top_p``, ``top_k``, ``min_p``, ``num_predict`` (-1 / -2: until the model stops or the
context is full), ``stop``, ``seed``, ``repeat_penalty``, ``repeat_last_n`` (the penalty
window; 0 turns the penalties off), ``presence_penalty``, ``frequency_penalty``; ``format``
(``"json"`` or a schema) and the extensions ``regex``, ``grammar`` (``exo_p2p.api.formats``)
constrain the output. Options that only tune Ollama's own runtime (``num_ctx``,
``num_thread``, ``num_gpu``, ``num_batch``, …) are ignored, as Ollama ignores options it does
not know; sampling options we cannot honour (``mirostat``, ``tfs_z``, ``typical_p`` at
non-default values) are refused by name. Defaults not given are ``GenerationParams``' own (Ollama's model files would set their own).
``tools``, tool calls and ``think`` as ``ollama_tools`` says. ``/api/generate`` with ``raw: true`` sends the prompt without the chat template; an empty
prompt (or no messages) answers at once with ``done_reason: "load"``, as Ollama does. The
last object of a stream (and a non-streamed body) has ``done: true``, ``done_reason``,
``prompt_eval_count``, ``eval_count`` and durations in nanoseconds. Errors are
``{"error": "…"}``; an error mid-stream is one such line, which ends the stream.

``GET /`` is content-negotiated: a client that accepts ``text/html`` (a browser) gets the
route named ``dashboard`` when the app has one, everyone else "Ollama is running".
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from exo_p2p.api.context import ApiContext
from exo_p2p.api.demand.preload import load_or_unload, request_keep_alive
from exo_p2p.api.errors import ollama_error_body
from exo_p2p.api.families.common import one_line_json
from exo_p2p.api.families.ollama.params import (  # noqa: F401 - the request types and rules, re-exported
    OPTION_INT_LIMIT, RUNTIME_OPTIONS, ChatRequest, GenerateRequest, OllamaMessage, ShowRequest, chat_params, generate_params,
    options_fields)
from exo_p2p.api.families.ollama.models import known, meant, model_routes, timestamp
from exo_p2p.api.families.logprob_shapes import ollama_entry
from exo_p2p.api.families.ollama.tools import calls_doc, ollama_thinking, with_parts
from exo_p2p.api.vision.admit import check_images
from exo_p2p.api.generation.path import GenerationResponse
from exo_p2p.api.generation.job import GenerationJob, new_task_id
from exo_p2p.api.generation.turn import Turn
from exo_p2p.types import ErrorInfo, FinishChunk, ToolCall
from exo_p2p.types.chunks import TokenLogprobs

NDJSON_MEDIA_TYPE = "application/x-ndjson"
ROOT_TEXT = "Ollama is running"
DASHBOARD_ROUTE = "dashboard"
"""Name of the route ``GET /`` serves to browsers (registered by the dashboard, if any)."""
_json = msgspec.json.Encoder()


class OllamaEncoder:
    """NDJSON of one generation: ``chat`` objects carry ``message``, ``generate`` objects
    ``response``. Durations are nanoseconds, measured from the encoder's creation (the
    request's arrival) and the runner's ``ttft`` / decode rate."""

    family = "ollama"
    media_type = NDJSON_MEDIA_TYPE

    def __init__(self, model: str, kind: str, think: bool = False, logprobs: bool = False) -> None:
        self.model = model
        self.kind = kind
        self.think = think
        """Whether reasoning is answered (``think`` asked for it)."""
        self.logprobs = logprobs
        """Whether the answer carries ``logprobs`` (``logprobs: true`` asked for them)."""
        self.t0 = time.monotonic()

    def _object(self, text: str, done: bool, **extra: Any) -> dict[str, Any]:
        doc: dict[str, Any] = {"model": self.model, "created_at": timestamp()}
        if self.kind == "chat":
            doc["message"] = {"role": "assistant", "content": text}
        else:
            doc["response"] = text
        doc["done"] = done
        doc.update(extra)
        return doc

    def _line(self, doc: dict[str, Any]) -> bytes:
        return one_line_json(doc) + b"\n"

    def stats(self, chunk: FinishChunk) -> dict[str, Any]:
        total = time.monotonic() - self.t0
        decode = (chunk.completion_tokens - 1) / chunk.decode_tokens_per_second if chunk.decode_tokens_per_second > 0 else 0.0
        return {
            "done_reason": "length" if chunk.finish_reason == "length" else "stop",
            "total_duration": int(total * 1e9),
            "load_duration": 0,
            "prompt_eval_count": chunk.prompt_tokens,
            "prompt_eval_duration": int(chunk.ttft * 1e9),
            "eval_count": chunk.completion_tokens,
            "eval_duration": int(decode * 1e9),
        }

    def start(self, prompt_tokens: int | None) -> bytes:
        return b""

    def text(self, delta: str) -> bytes:
        return self._line(self._object(delta, False))

    def text_with_logprobs(self, delta: str, logprobs: TokenLogprobs, offset: int) -> bytes:
        """A token's object with its ``logprobs`` entry (``logprob_shapes.ollama_entry``)."""
        return self._line(self._object(delta, False, logprobs=[ollama_entry(logprobs)]))

    def finish(self, chunk: FinishChunk) -> bytes:
        return self._line(self._object("", True, **self.stats(chunk)))

    def error(self, info: ErrorInfo) -> bytes:
        return one_line_json(ollama_error_body(info)) + b"\n"

    def keepalive(self) -> bytes:
        return self.text("")

    def body(self, text: str, chunk: FinishChunk) -> bytes:
        return _json.encode(self._object(text, True, **self.stats(chunk)))

    def reasoning(self, delta: str) -> bytes:
        return self._line(with_parts(self._object("", False), thinking=delta)) if self.think else b""

    def calls(self, calls: tuple[ToolCall, ...], first: int) -> bytes:
        return self._line(with_parts(self._object("", False), calls=calls_doc(calls, first)))

    def answer(self, turn: Turn, chunk: FinishChunk) -> bytes:
        """A whole answer with its thinking (when asked for) and tool calls (``ollama_tools``)."""
        doc = self._object(turn.text, True, **self.stats(chunk))
        if self.logprobs:
            doc["logprobs"] = [ollama_entry(lp) for lp in turn.logprobs]
        return _json.encode(with_parts(doc, thinking=turn.reasoning if self.think else "", calls=calls_doc(turn.calls)))

    def load_answer(self, reason: str = "load") -> Response:
        """The answer to a load request (no prompt): ``done_reason`` ``"load"``, or ``"unload"``
        for ``keep_alive: 0``."""
        doc = self._object("", True, done_reason=reason)
        return Response(_json.encode(doc) + b"\n", media_type="application/json")


def accepts_html(request: Request) -> bool:
    """Whether the client says it takes ``text/html`` (a browser navigating to the page)."""
    return "text/html" in request.headers.get("accept", "").lower()


def _route_named(request: Request, name: str) -> Route | None:
    for route in getattr(request.app, "routes", []):
        if getattr(route, "name", None) == name and isinstance(route, Route):
            return route
    return None


async def root(request: Request) -> Response | ASGIApp:
    """``GET|HEAD /``: "Ollama is running", which clients probe; a browser (``accepts_html``)
    gets the route named ``DASHBOARD_ROUTE`` instead when the app has one."""
    if request.method == "GET" and accepts_html(request):
        page = _route_named(request, DASHBOARD_ROUTE)
        if page is not None:
            async def serve_page(scope: Scope, receive: Receive, send: Send) -> None:
                await page.handle(scope, receive, send)
            return serve_page  # type: ignore[return-value]
    return PlainTextResponse(ROOT_TEXT)


def routes(ctx: ApiContext) -> list[Route]:
    """The Ollama routes (see the module docstring); the model endpoints are ``ollama_models``'."""

    async def answer(request: Request, kind: str, request_type, to_params) -> Response | GenerationResponse:  # type: ignore[no-untyped-def]
        """``/api/chat`` (``kind`` "chat") and ``/api/generate``: one generation, or the
        "load" answer Ollama gives a request without messages/prompt."""
        r = await ctx.read_json(request, request_type)
        keep_alive = request_keep_alive(r.keep_alive)
        params = await ctx.job(to_params, r)
        wanted = meant(ctx, r.model)
        encoder = OllamaEncoder(wanted, kind, think=bool(ollama_thinking(r.think)), logprobs=bool(r.logprobs))
        if params is None:  # Ollama's load and unload idioms (exo_p2p.api.demand.preload)
            known(ctx, r.model)
            return encoder.load_answer(await load_or_unload(ctx.backend, ctx.config.generation.demand, wanted, keep_alive))
        check_images(ctx.card(wanted), wanted, params.messages, param="messages" if kind == "chat" else "images")
        return ctx.generate(GenerationJob(model_id=wanted, params=params, stream=r.stream, encoder=encoder,
                                          task_id=new_task_id(), keep_alive=keep_alive))

    async def chat(request: Request) -> Response | GenerationResponse:
        return await answer(request, "chat", ChatRequest, chat_params)

    async def generate(request: Request) -> Response | GenerationResponse:
        return await answer(request, "generate", GenerateRequest, generate_params)

    return [
        Route("/", root, methods=["GET", "HEAD"]),
        Route("/api/chat", chat, methods=["POST"]),
        Route("/api/generate", generate, methods=["POST"]),
        *model_routes(ctx),
    ]
