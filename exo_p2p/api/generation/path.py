"""The shared path of every generation, whatever API family asked for it.

A family module (``exo_p2p.api.families``) turns its request into a ``GenerationJob``: the
model id, our ``GenerationParams``, whether to stream, and a ``StreamEncoder`` that turns our
chunks into the family's bytes. ``GenerationResponse`` is the ASGI app that answers a job,
written once for all families. Its contract:

- ``open_chunks`` is called before ``SubmitTask``, ``close_chunks`` always at the end.
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
- A task that fails on the serving side (its instance's node or runner died, chunks were
  lost) does not end the request: it moves — a continuation task with the tokens already
  sent is submitted, and the client's stream goes on from the continuation's chunks, with
  keep-alives while it waits; at most ``max_moves`` times, each accepted within
  ``move_bound`` seconds, else the failure's error is answered (rules: ``exo_p2p.api.generation.resume``).
  A cancellation or disconnect during a move cancels the current task.

The parts: what the client receives (status, stream start, keep-alives) is
``exo_p2p.api.generation.client_stream.ClientStream``; the task on the cluster, its chunks, its cancel
and its moves are ``exo_p2p.api.generation.serving_task.ServingTask``; the job's types are in
``exo_p2p.api.generation.job``. This module decides what to answer from the chunks.
"""

from __future__ import annotations

import structlog
import trio
from starlette.types import Receive, Scope, Send

from exo_p2p.api.backend import ApiBackend
from exo_p2p.api.generation.client_key import client_key
from exo_p2p.api.generation.client_stream import ClientStream
from exo_p2p.api.errors import error_info
from exo_p2p.api.generation.job import GenerationJob, GenerationSettings, InFlight, send_error, with_client
from exo_p2p.api.generation.request_trace import RequestTrace, prompt_text
from exo_p2p.api.generation.resume import MoveCounters
from exo_p2p.api.generation.serving_task import ServingTask
from exo_p2p.api.generation.turn import Turn, answer_bytes, finish_bytes, token_bytes
from exo_p2p.metrics.observer import Observer
from exo_p2p.types import Chunk, ErrorChunk, FinishChunk, PrefillProgressChunk, TokenChunk

log = structlog.get_logger("exo_p2p.api")


class GenerationResponse:
    """The ASGI app answering one ``GenerationJob`` (see the module docstring)."""

    def __init__(self, backend: ApiBackend, job: GenerationJob, inflight: InFlight, settings: GenerationSettings,
                 counters: MoveCounters | None = None, observer: Observer | None = None) -> None:
        self.backend = backend
        self.job = job
        self.encoder = job.encoder
        self.inflight = inflight
        self.settings = settings
        self._outcome = "unanswered"
        self.counters = counters if counters is not None else MoveCounters()
        self.observer = observer
        self.trace = RequestTrace(job.task_id, job.encoder.family, job.model_id)
        self._turn = Turn()
        """The answer handed to the client so far (``exo_p2p.api.generation.turn``)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.job = with_client(self.job, client_key(scope))
        self._start_trace(scope)
        out = ClientStream(send, self.encoder, stream=self.job.stream, keepalive_interval=self.settings.keepalive_interval)
        if not self.inflight.try_acquire():
            limit = self.inflight.limit
            message = f"queue full: {self.inflight.count} requests in flight, limit {limit}"
            await send_error(send, error_info(429, message, code="queue_full"), self.encoder.family)
            self._observe("refused 429", out.streaming)
            return
        task = ServingTask(self.backend, self.job, self.settings, out, self.trace, self.counters)
        try:
            task.open()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._watch_disconnect, receive, nursery.cancel_scope, task)
                    await self._answer(task, out)
                    nursery.cancel_scope.cancel()
            finally:
                await task.end()
        finally:
            self.inflight.release()
            log.debug("api.generation", task_id=task.task_id, model=self.job.model_id, family=self.encoder.family, outcome=self._outcome)
            self._observe(self._outcome, out.streaming)

    def _start_trace(self, scope: Scope) -> None:
        """The request's trace, with the id of the API key it presented (``AccessGuard``)."""
        if self.observer is None:
            return
        key_id = (scope.get("state") or {}).get("api_key_id")
        keep = self.observer.keep_text
        params = self.job.params
        self.trace = RequestTrace(self.job.task_id, self.encoder.family, self.job.model_id, key_id=key_id,
                                  keep_text=keep, prompt=prompt_text(params.messages, params.prompt) if keep else None)

    def _observe(self, outcome: str, streamed: bool) -> None:
        """Hand the request's record to the observer (once, at the end; none when it is off)."""
        if self.observer is None or not self.observer.active:
            return
        self.trace.streamed = streamed
        try:
            state = self.backend.state()
        except Exception:  # noqa: BLE001 - the record goes without the instance's nodes
            state = None
        self.observer.finished(self.trace.record(outcome, state))

    async def _watch_disconnect(self, receive: Receive, scope: trio.CancelScope, task: ServingTask) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not task.ended:
                    self._outcome = "client disconnected"
                scope.cancel()
                return

    async def _answer(self, task: ServingTask, out: ClientStream) -> None:
        result = await task.submit()
        if result.error is not None:
            self._outcome = f"refused {result.error.status}"
            if out.streaming:  # keep-alives began the stream while it waited
                await out.end_with_error(result.error)
            else:
                await out.error_body(result.error)
            return
        first = await task.next()
        if isinstance(first, ErrorChunk) and not out.streaming:
            self._outcome = f"error {first.error.status} before output"
            await out.error_body(first.error)
        elif self.job.stream:
            await self._stream(first, task, out)
        else:
            await self._collect(first, task, out)

    async def _stream(self, chunk: Chunk, task: ServingTask, out: ClientStream) -> None:
        if not out.streaming:
            await out.begin(chunk.total if isinstance(chunk, PrefillProgressChunk) else None)
        while True:
            if isinstance(chunk, TokenChunk):
                await out.send(token_bytes(self.encoder, chunk, self._turn))
            elif isinstance(chunk, FinishChunk):
                self._outcome = f"streamed, {chunk.finish_reason}"
                await out.send(finish_bytes(self.encoder, chunk, self._turn), more=False)
                return
            elif isinstance(chunk, ErrorChunk):
                self._outcome = f"error {chunk.error.status} mid-stream"
                await out.end_with_error(chunk.error)
                return
            elif not isinstance(chunk, PrefillProgressChunk):  # pragma: no cover - a new chunk kind
                log.warning("api.unknown_chunk", kind=type(chunk).__name__)
            chunk = await task.next()

    async def _collect(self, chunk: Chunk, task: ServingTask, out: ClientStream) -> None:
        while True:
            if isinstance(chunk, TokenChunk):
                self._turn.add(chunk)
            elif isinstance(chunk, FinishChunk):
                self._outcome = f"complete, {chunk.finish_reason}"
                await out.body(answer_bytes(self.encoder, self._turn, chunk))
                return
            elif isinstance(chunk, ErrorChunk):
                self._outcome = f"error {chunk.error.status}"
                await out.error_body(chunk.error)
                return
            chunk = await task.next()
