"""Answering one chat completion: submit it to the master, relay its chunks to the client.

``GenerationResponse`` is the ASGI app a validated request is answered with. Its contract:

- ``open_chunks`` is called before ``SubmitGeneration``, ``close_chunks`` always at the end.
- A command error is answered with its status as JSON (design.md §5b: 404/409/503...).
- The response status is committed only when the first chunk arrives: an ``ErrorChunk``
  first (e.g. a prompt longer than the context, refused before prefill) is answered with its
  status as JSON even for ``stream: true``.
- Streaming: SSE events per ``exo_p2p.api.sse``; an ``ErrorChunk`` after the stream began is
  sent as ``data: {"error": …}`` then ``data: [DONE]``.
- A client that disconnects (streaming or not), or a wait that times out, makes it send
  ``CancelGeneration`` (shielded, bounded by ``cancel_timeout``).
- With a queue limit, a request beyond it is answered 429 at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import structlog
import trio
from starlette.types import Receive, Scope, Send

from exo_p2p.api.backend import ApiBackend
from exo_p2p.api.chat_params import ChatPlan
from exo_p2p.api.errors import error_body, error_headers, error_info
from exo_p2p.api.sse import DONE, SSE_HEADERS, SSE_MEDIA_TYPE, CompletionFormat, sse_error
from exo_p2p.types import (
    CancelGeneration,
    Chunk,
    ErrorChunk,
    ErrorInfo,
    FinishChunk,
    NodeId,
    PrefillProgressChunk,
    SubmitGeneration,
    TaskId,
    TokenChunk,
    new_id,
)

log = structlog.get_logger("exo_p2p.api")


@dataclass(frozen=True)
class GenerationSettings:
    """Bounded waits of one generation, in seconds.

    ``chunk_timeout``: longest wait for the next chunk (queued requests wait here too, so it
    is generous; the node itself guarantees an ``ErrorChunk`` when a runner dies);
    ``command_timeout``: the wait for the master's answer to ``SubmitGeneration``;
    ``cancel_timeout``: the wait for ``CancelGeneration`` after a disconnect.
    """

    chunk_timeout: float = 600.0
    command_timeout: float = 30.0
    cancel_timeout: float = 5.0


class InFlight:
    """Counts the generations this API is serving against an optional ``limit``.

    Single-threaded (trio): ``try_acquire`` and ``release`` never await, so no lock is needed.
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.count = 0

    def try_acquire(self) -> bool:
        """Take a slot; False when ``limit`` slots are already taken."""
        if self.limit is not None and self.count >= self.limit:
            return False
        self.count += 1
        return True

    def release(self) -> None:
        self.count -= 1


async def send_bytes(send: Send, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
    """Send a whole JSON response (``status``, ``body``) through ASGI ``send``."""
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(send: Send, info: ErrorInfo) -> None:
    """Send ``info`` as an OpenAI-shaped JSON error with its status."""
    status = info.status if 400 <= info.status <= 599 else 500
    await send_bytes(send, status, error_body(info), error_headers(info))


class GenerationResponse:
    """The ASGI app answering one validated chat completion (see the module docstring)."""

    def __init__(self, backend: ApiBackend, plan: ChatPlan, inflight: InFlight, settings: GenerationSettings) -> None:
        self.backend = backend
        self.plan = plan
        self.inflight = inflight
        self.settings = settings
        self.task_id = TaskId(new_id())
        self.format = CompletionFormat(id=f"chatcmpl-{self.task_id}", created=int(time.time()), model=plan.model_id)
        self._submitted = False
        self._ended = False
        self._outcome = "unanswered"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.inflight.try_acquire():
            limit = self.inflight.limit
            message = f"queue full: {self.inflight.count} requests in flight, limit {limit}"
            await send_error(send, error_info(429, message, code="queue_full"))
            return
        try:
            chunks = self.backend.open_chunks(self.task_id)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._watch_disconnect, receive, nursery.cancel_scope)
                    await self._answer(chunks, send)
                    nursery.cancel_scope.cancel()
            finally:
                if self._submitted and not self._ended:
                    await self._cancel()
                self.backend.close_chunks(self.task_id)
        finally:
            self.inflight.release()
            log.debug("api.generation", task_id=self.task_id, model=self.plan.model_id, outcome=self._outcome)

    async def _watch_disconnect(self, receive: Receive, scope: trio.CancelScope) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not self._ended:
                    self._outcome = "client disconnected"
                scope.cancel()
                return

    async def _cancel(self) -> None:
        command = CancelGeneration(command_id=new_id(), task_id=self.task_id)
        with trio.CancelScope(shield=True), trio.move_on_after(self.settings.cancel_timeout):
            try:
                result = await self.backend.command(command, timeout=self.settings.cancel_timeout)
                if result.error is not None:
                    log.info("api.cancel_refused", task_id=self.task_id, error=result.error.message)
            except Exception:  # the client is gone; nobody to tell but the log
                log.exception("api.cancel_failed", task_id=self.task_id)

    async def _answer(self, chunks: trio.MemoryReceiveChannel[Chunk], send: Send) -> None:
        submit = SubmitGeneration(
            command_id=new_id(),
            task_id=self.task_id,
            model_id=self.plan.model_id,
            params=self.plan.params,
            api_node_id=NodeId(self.backend.node_id),
        )
        self._submitted = True
        result = await self.backend.command(submit, timeout=self.settings.command_timeout)
        if result.error is not None:
            self._ended = True
            self._outcome = f"refused {result.error.status}"
            await send_error(send, result.error)
            return
        first = await self._next(chunks)
        if isinstance(first, ErrorChunk):
            self._outcome = f"error {first.error.status} before output"
            await send_error(send, first.error)
        elif self.plan.stream:
            await self._stream(first, chunks, send)
        else:
            await self._collect(first, chunks, send)

    async def _next(self, chunks: trio.MemoryReceiveChannel[Chunk]) -> Chunk:
        """The next chunk; a synthetic ``ErrorChunk`` when none comes within ``chunk_timeout``
        (504) or the node closed the channel without a last chunk (503)."""
        with trio.move_on_after(self.settings.chunk_timeout):
            try:
                chunk = await chunks.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                info = error_info(503, "the generation ended without a result (the node lost the task)")
                return ErrorChunk(task_id=self.task_id, error=info)
            if isinstance(chunk, (FinishChunk, ErrorChunk)):
                self._ended = True
            return chunk
        message = f"no output from the model for {self.settings.chunk_timeout:g} s"
        return ErrorChunk(task_id=self.task_id, error=error_info(504, message, code="timeout"))

    async def _stream(self, chunk: Chunk, chunks: trio.MemoryReceiveChannel[Chunk], send: Send) -> None:
        headers = [(b"content-type", SSE_MEDIA_TYPE.encode())] + [(k.encode(), v.encode()) for k, v in SSE_HEADERS.items()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": self.format.role_event(), "more_body": True})
        while True:
            if isinstance(chunk, TokenChunk):
                if chunk.text:
                    await send({"type": "http.response.body", "body": self.format.content_event(chunk.text), "more_body": True})
            elif isinstance(chunk, FinishChunk):
                tail = self.format.finish_event(chunk.finish_reason)
                if self.plan.include_usage:
                    tail += self.format.usage_event(chunk.prompt_tokens, chunk.completion_tokens)
                self._outcome = f"streamed, {chunk.finish_reason}"
                await send({"type": "http.response.body", "body": tail + DONE, "more_body": False})
                return
            elif isinstance(chunk, ErrorChunk):
                self._outcome = f"error {chunk.error.status} mid-stream"
                await send({"type": "http.response.body", "body": sse_error(chunk.error) + DONE, "more_body": False})
                return
            elif not isinstance(chunk, PrefillProgressChunk):  # pragma: no cover - a new chunk kind
                log.warning("api.unknown_chunk", kind=type(chunk).__name__)
            chunk = await self._next(chunks)

    async def _collect(self, chunk: Chunk, chunks: trio.MemoryReceiveChannel[Chunk], send: Send) -> None:
        texts: list[str] = []
        while True:
            if isinstance(chunk, TokenChunk):
                texts.append(chunk.text)
            elif isinstance(chunk, FinishChunk):
                body = self.format.completion_body("".join(texts), chunk.finish_reason, chunk.prompt_tokens, chunk.completion_tokens)
                self._outcome = f"complete, {chunk.finish_reason}"
                await send_bytes(send, 200, body)
                return
            elif isinstance(chunk, ErrorChunk):
                self._outcome = f"error {chunk.error.status}"
                await send_error(send, chunk.error)
                return
            chunk = await self._next(chunks)
