"""The shared path of every generation, whatever API family asked for it.

A family module (``exo_p2p.api.families``) turns its request into a ``GenerationJob``: the
model id, our ``GenerationParams``, whether to stream, and a ``StreamEncoder`` that turns our
chunks into the family's bytes. ``GenerationResponse`` is the ASGI app that answers a job,
written once for all families. Its contract:

- ``open_chunks`` is called before ``SubmitGeneration``, ``close_chunks`` always at the end.
- A command error is answered with its status in the family's error shape (
  404/409/503..., with ``Retry-After`` / ``x-should-retry`` per ``exo_p2p.api.errors``).
- The response status is committed when the first chunk arrives: an ``ErrorChunk`` first
  (e.g. a prompt longer than the context, refused before prefill) is answered with its
  status as an error body even for a stream. A stream whose first chunk has not come within
  ``keepalive_interval`` (a queued request) is committed then, so that keep-alives can flow.
- Streaming: the encoder's events; after ``keepalive_interval`` seconds without bytes (a
  long prefill, a queue) the encoder's keep-alive (an SSE comment, an Anthropic ``ping``, an
  empty NDJSON chunk) is sent, so proxies never see a silent stream for 10 s. An
  ``ErrorChunk`` after the stream began is sent as the family's in-stream error event, which
  ends the stream.
- A client that disconnects (streaming or not), or a wait that times out, makes it send
  ``CancelGeneration`` (shielded, bounded by ``cancel_timeout``).
- With a queue limit, a request beyond it is answered 429 at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import structlog
import trio
from starlette.types import Receive, Scope, Send

from exo_p2p.api.backend import ApiBackend
from exo_p2p.api.errors import Family, error_headers, error_info, family_error_body
from exo_p2p.types import (
    CancelGeneration,
    Chunk,
    ErrorChunk,
    ErrorInfo,
    FinishChunk,
    GenerationParams,
    NodeId,
    PrefillProgressChunk,
    SubmitGeneration,
    TaskId,
    TokenChunk,
    new_id,
)

log = structlog.get_logger("exo_p2p.api")

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
"""Headers of every stream (no caching, no proxy buffering)."""


@dataclass(frozen=True)
class GenerationSettings:
    """Bounded waits of one generation, in seconds.

    ``chunk_timeout``: longest wait for the next chunk (queued requests wait here too, so it
    is generous; the node itself guarantees an ``ErrorChunk`` when a runner dies);
    ``command_timeout``: the wait for the master's answer to ``SubmitGeneration``;
    ``cancel_timeout``: the wait for ``CancelGeneration`` after a disconnect;
    ``keepalive_interval``: the longest a stream stays silent (must be < 10).
    """

    chunk_timeout: float = 600.0
    command_timeout: float = 30.0
    cancel_timeout: float = 5.0
    keepalive_interval: float = 5.0


class StreamEncoder(Protocol):
    """A family's bytes for one generation (pure; one per request).

    ``family`` names the error shape; ``media_type`` is the stream's content type.
    ``start(prompt_tokens)`` are the first bytes of a stream (None when the prompt size is
    not known yet); ``text(delta)`` one text delta (may be empty bytes); ``finish(chunk)``
    the closing events; ``error(info)`` an in-stream error that ends the stream;
    ``keepalive()`` bytes that carry no content; ``body(text, chunk)`` a whole non-streamed
    answer (JSON).
    """

    family: Family
    media_type: str

    def start(self, prompt_tokens: int | None) -> bytes: ...

    def text(self, delta: str) -> bytes: ...

    def finish(self, chunk: FinishChunk) -> bytes: ...

    def error(self, info: ErrorInfo) -> bytes: ...

    def keepalive(self) -> bytes: ...

    def body(self, text: str, chunk: FinishChunk) -> bytes: ...


@dataclass(frozen=True)
class GenerationJob:
    """A validated generation request of any family: what to run and how to answer."""

    model_id: str
    params: GenerationParams
    stream: bool
    encoder: StreamEncoder
    task_id: TaskId


def new_task_id() -> TaskId:
    """A fresh task id (families name their response ids after it)."""
    return TaskId(new_id())


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


async def send_bytes(send: Send, status: int, body: bytes, headers: dict[str, str] | None = None,
                     media_type: str = "application/json") -> None:
    """Send a whole response (``status``, ``body``) through ASGI ``send``."""
    raw = [(b"content-type", media_type.encode()), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(send: Send, info: ErrorInfo, family: str = "openai") -> None:
    """Send ``info`` as a JSON error in ``family``'s shape with its status and headers."""
    status = info.status if 400 <= info.status <= 599 else 500
    await send_bytes(send, status, family_error_body(family, info), error_headers(info))


class GenerationResponse:
    """The ASGI app answering one ``GenerationJob`` (see the module docstring)."""

    def __init__(self, backend: ApiBackend, job: GenerationJob, inflight: InFlight, settings: GenerationSettings) -> None:
        self.backend = backend
        self.job = job
        self.encoder = job.encoder
        self.inflight = inflight
        self.settings = settings
        self.task_id = job.task_id
        self._submitted = False
        self._ended = False
        self._outcome = "unanswered"
        self._streaming = False
        self._last_sent = 0.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.inflight.try_acquire():
            limit = self.inflight.limit
            message = f"queue full: {self.inflight.count} requests in flight, limit {limit}"
            await send_error(send, error_info(429, message, code="queue_full"), self.encoder.family)
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
            log.debug("api.generation", task_id=self.task_id, model=self.job.model_id, family=self.encoder.family, outcome=self._outcome)

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
            model_id=self.job.model_id,
            params=self.job.params,
            api_node_id=NodeId(self.backend.node_id),
        )
        self._submitted = True
        result = await self.backend.command(submit, timeout=self.settings.command_timeout)
        if result.error is not None:
            self._ended = True
            self._outcome = f"refused {result.error.status}"
            await send_error(send, result.error, self.encoder.family)
            return
        first = await self._next(chunks, send)
        if isinstance(first, ErrorChunk) and not self._streaming:
            self._outcome = f"error {first.error.status} before output"
            await send_error(send, first.error, self.encoder.family)
        elif self.job.stream:
            await self._stream(first, chunks, send)
        else:
            await self._collect(first, chunks, send)

    async def _begin_stream(self, send: Send, prompt_tokens: int | None) -> None:
        headers = [(b"content-type", self.encoder.media_type.encode())]
        headers += [(k.encode(), v.encode()) for k, v in SSE_HEADERS.items()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        self._streaming = True
        await self._send(send, self.encoder.start(prompt_tokens))

    async def _send(self, send: Send, body: bytes, *, more: bool = True) -> None:
        if body or not more:
            await send({"type": "http.response.body", "body": body, "more_body": more})
            self._last_sent = trio.current_time()

    async def _next(self, chunks: trio.MemoryReceiveChannel[Chunk], send: Send) -> Chunk:
        """The next chunk; a synthetic ``ErrorChunk`` when none comes within ``chunk_timeout``
        (504) or the node closed the channel without a last chunk (503). A stream gets a
        keep-alive after every ``keepalive_interval`` without bytes (and is begun by the
        first one when it has not begun yet)."""
        deadline = trio.current_time() + self.settings.chunk_timeout
        while True:
            now = trio.current_time()
            wait = deadline - now
            if self.job.stream:
                since = self._last_sent if self._streaming else now
                wait = min(wait, max(0.0, since + self.settings.keepalive_interval - now))
            with trio.move_on_after(wait):
                try:
                    chunk = await chunks.receive()
                except (trio.EndOfChannel, trio.ClosedResourceError):
                    info = error_info(503, "the generation ended without a result (the node lost the task)")
                    return ErrorChunk(task_id=self.task_id, error=info)
                if isinstance(chunk, (FinishChunk, ErrorChunk)):
                    self._ended = True
                return chunk
            if trio.current_time() >= deadline:
                message = f"no output from the model for {self.settings.chunk_timeout:g} s"
                return ErrorChunk(task_id=self.task_id, error=error_info(504, message, code="timeout"))
            if not self._streaming:
                await self._begin_stream(send, None)
            else:
                await self._send(send, self.encoder.keepalive())
                self._last_sent = trio.current_time()

    async def _stream(self, chunk: Chunk, chunks: trio.MemoryReceiveChannel[Chunk], send: Send) -> None:
        if not self._streaming:
            await self._begin_stream(send, chunk.total if isinstance(chunk, PrefillProgressChunk) else None)
        while True:
            if isinstance(chunk, TokenChunk):
                if chunk.text:
                    await self._send(send, self.encoder.text(chunk.text))
            elif isinstance(chunk, FinishChunk):
                self._outcome = f"streamed, {chunk.finish_reason}"
                await self._send(send, self.encoder.finish(chunk), more=False)
                return
            elif isinstance(chunk, ErrorChunk):
                self._outcome = f"error {chunk.error.status} mid-stream"
                await self._send(send, self.encoder.error(chunk.error), more=False)
                return
            elif not isinstance(chunk, PrefillProgressChunk):  # pragma: no cover - a new chunk kind
                log.warning("api.unknown_chunk", kind=type(chunk).__name__)
            chunk = await self._next(chunks, send)

    async def _collect(self, chunk: Chunk, chunks: trio.MemoryReceiveChannel[Chunk], send: Send) -> None:
        texts: list[str] = []
        while True:
            if isinstance(chunk, TokenChunk):
                texts.append(chunk.text)
            elif isinstance(chunk, FinishChunk):
                self._outcome = f"complete, {chunk.finish_reason}"
                await send_bytes(send, 200, self.encoder.body("".join(texts), chunk))
                return
            elif isinstance(chunk, ErrorChunk):
                self._outcome = f"error {chunk.error.status}"
                await send_error(send, chunk.error, self.encoder.family)
                return
            chunk = await self._next(chunks, send)
