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
- A task that fails on the serving side (its instance's node or runner died, chunks were
  lost) does not end the request: it moves — a continuation task with the tokens already
  sent is submitted, and the client's stream goes on from the continuation's chunks, with
  keep-alives while it waits; at most ``max_moves`` times, each accepted within
  ``move_bound`` seconds, else the failure's error is answered (rules: ``exo_p2p.api.resume``).
  A cancellation or disconnect during a move cancels the current task.
"""

from __future__ import annotations

import msgspec
import structlog
import trio
from starlette.types import Receive, Scope, Send

from exo_p2p.api.backend import ApiBackend
from exo_p2p.api.errors import error_info
from exo_p2p.metrics.observer import Observer
from exo_p2p.api.replacement_progress import ProgressAge, progress_mark
from exo_p2p.api.request_trace import RequestTrace, prompt_text
from exo_p2p.api.resume import (
    MOVABLE_CODE,
    GiveUp,
    MoveCounters,
    instance_failed,
    model_given_up,
    movable,
    on_failure,
    on_refusal,
    suspect,
    waits_for_replacement,
)
from exo_p2p.api.turn import Turn, answer_bytes, finish_bytes, token_bytes
from exo_p2p.types import (
    CancelGeneration,
    CommandResult,
    Chunk,
    ErrorChunk,
    ErrorInfo,
    FinishChunk,
    NodeId,
    PrefillProgressChunk,
    SubmitGeneration,
    TokenChunk,
    new_id,
)

from exo_p2p.api.generation_job import (  # noqa: F401 - re-exported: the families import them from here
    SSE_HEADERS, GenerationJob, GenerationSettings, InFlight, StreamEncoder, new_task_id, send_bytes, send_error)

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
        self.task_id = job.task_id
        self._submitted = False
        self._ended = False
        self._outcome = "unanswered"
        self._streaming = False
        self._last_sent = 0.0
        self.counters = counters if counters is not None else MoveCounters()
        self._chunks: trio.MemoryReceiveChannel[Chunk] | None = None
        self._sent_tokens: list[int] = []
        """Token ids of the chunks handed to the client so far (what a move resumes from)."""
        self._moves = 0
        self._instance_id: str | None = None
        """The instance the master gave the current task to."""
        self.observer = observer
        self.trace = RequestTrace(job.task_id, job.encoder.family, job.model_id)
        self._turn = Turn()
        """The answer handed to the client so far (``exo_p2p.api.turn``)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._start_trace(scope)
        if not self.inflight.try_acquire():
            limit = self.inflight.limit
            message = f"queue full: {self.inflight.count} requests in flight, limit {limit}"
            await send_error(send, error_info(429, message, code="queue_full"), self.encoder.family)
            self._observe("refused 429")
            return
        try:
            self._chunks = self.backend.open_chunks(self.task_id)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._watch_disconnect, receive, nursery.cancel_scope)
                    await self._answer(send)
                    nursery.cancel_scope.cancel()
            finally:
                if self._submitted and not self._ended:
                    await self._cancel()
                self.backend.close_chunks(self.task_id)
        finally:
            self.inflight.release()
            log.debug("api.generation", task_id=self.task_id, model=self.job.model_id, family=self.encoder.family, outcome=self._outcome)
            self._observe(self._outcome)

    def _start_trace(self, scope: Scope) -> None:
        """The request's trace, with the id of the API key it presented (``AccessGuard``)."""
        if self.observer is None:
            return
        key_id = (scope.get("state") or {}).get("api_key_id")
        keep = self.observer.keep_text
        params = self.job.params
        self.trace = RequestTrace(self.job.task_id, self.encoder.family, self.job.model_id, key_id=key_id,
                                  keep_text=keep, prompt=prompt_text(params.messages, params.prompt) if keep else None)

    def _observe(self, outcome: str) -> None:
        """Hand the request's record to the observer (once, at the end; none when it is off)."""
        if self.observer is None or not self.observer.active:
            return
        self.trace.streamed = self._streaming
        try:
            state = self.backend.state()
        except Exception:  # noqa: BLE001 - the record goes without the instance's nodes
            state = None
        self.observer.finished(self.trace.record(outcome, state))

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

    async def _answer(self, send: Send) -> None:
        submit = SubmitGeneration(
            command_id=new_id(),
            task_id=self.task_id,
            model_id=self.job.model_id,
            params=self.job.params,
            api_node_id=NodeId(self.backend.node_id),
        )
        self._submitted = True
        result = await self.backend.command(submit, timeout=self.settings.command_timeout)
        if result.error is not None and self.settings.max_moves and waits_for_replacement(result.error, self.backend.state(), self.job.model_id):
            result = await self._wait_for_replacement(submit, result, send)
        self._instance_id = result.instance_id
        self.trace.routed(result)
        if result.error is not None:
            self._ended = True
            self._outcome = f"refused {result.error.status}"
            if self._streaming:  # keep-alives began the stream while it waited
                await self._send(send, self.encoder.error(result.error), more=False)
            else:
                await send_error(send, result.error, self.encoder.family)
            return
        first = await self._next(send)
        if isinstance(first, ErrorChunk) and not self._streaming:
            self._outcome = f"error {first.error.status} before output"
            await send_error(send, first.error, self.encoder.family)
        elif self.job.stream:
            await self._stream(first, send)
        else:
            await self._collect(first, send)

    async def _begin_stream(self, send: Send, prompt_tokens: int | None) -> None:
        headers = [(b"content-type", self.encoder.media_type.encode())]
        headers += [(k.encode(), v.encode()) for k, v in SSE_HEADERS.items()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        self._streaming = True
        self._last_sent = trio.current_time()
        await self._send(send, self.encoder.start(prompt_tokens))

    async def _send(self, send: Send, body: bytes, *, more: bool = True) -> None:
        if body or not more:
            await send({"type": "http.response.body", "body": body, "more_body": more})
            self._last_sent = trio.current_time()

    async def _next(self, send: Send) -> Chunk:
        """The next chunk for the client, across moves: a movable failure of the current
        task is replaced by the continuation's chunks (``_move``), or by the error to answer
        when the request cannot move. Records the token ids handed out."""
        while True:
            chunk = await self._receive(send)
            if isinstance(chunk, ErrorChunk) and self.settings.max_moves and suspect(chunk.error) and await self._instance_fails(send):
                info = chunk.error
                chunk = ErrorChunk(task_id=chunk.task_id, error=ErrorInfo(503, info.message, info.type, info.param, MOVABLE_CODE))
            if isinstance(chunk, ErrorChunk) and movable(chunk.error):
                error = await self._move(chunk.error, send)
                if error is None:
                    continue
                return ErrorChunk(task_id=self.task_id, error=error)
            if isinstance(chunk, TokenChunk) and chunk.token_id is not None:
                self._sent_tokens.append(chunk.token_id)
            self.trace.chunk(chunk)
            return chunk

    async def _instance_fails(self, send: Send) -> bool:
        """Whether the current task's instance fails within ``fail_wait`` seconds (polled
        from State; keep-alives meanwhile)."""
        started = trio.current_time()
        while trio.current_time() - started < self.settings.fail_wait:
            if instance_failed(self.backend.state(), self._instance_id):
                return True
            await trio.sleep(0.25)
            await self._keepalive_if_due(send, started)
        return False

    async def _move(self, failure: ErrorInfo, send: Send) -> ErrorInfo | None:
        """Move the request after its task failed with ``failure``: submit continuations
        until one is accepted (None) or the rules give up (the error to answer)."""
        decision = on_failure(failure, tuple(self._sent_tokens), self._moves, self.settings.max_moves)
        if isinstance(decision, GiveUp):
            self.counters.failed += 1
            return decision.error
        started = trio.current_time()
        if self._streaming:  # the waits below are bounded (5 s each): start each silence afresh
            await self._send(send, self.encoder.keepalive())
        await self._cancel()  # the failed task may still run (chunks lost on the way)
        self.backend.close_chunks(self.task_id)
        params = msgspec.structs.replace(self.job.params, resume_tokens=decision.resume_tokens, origin_task_id=self.job.task_id)
        progress = ProgressAge(trio.current_time())
        while True:
            task_id = new_task_id()
            # the continuation is the current task from its submission on: a disconnect
            # while the master answers cancels it
            self.task_id, self._chunks, self._ended = task_id, self.backend.open_chunks(task_id), False
            submit = SubmitGeneration(command_id=new_id(), task_id=task_id, model_id=self.job.model_id, params=params,
                                      api_node_id=NodeId(self.backend.node_id))
            # bounded by the keep-alive interval, so a stream is never silent for long
            timeout = min(self.settings.command_timeout, self.settings.keepalive_interval)
            await self._keepalive_if_due(send, started)
            result = await self.backend.command(submit, timeout=timeout)
            if result.error is None:
                self._instance_id = result.instance_id
                self._moves += 1
                self.counters.moved += 1
                self.trace.routed(result)
                self.trace.moves = self._moves
                log.info("api.request_moved", task_id=task_id, origin=self.job.task_id, instance_id=result.instance_id,
                         resumed_tokens=len(decision.resume_tokens), moves=self._moves, reason=failure.message)
                return None
            self.backend.close_chunks(task_id)
            self._ended = True
            now = trio.current_time()
            state = self.backend.state()
            given_up = model_given_up(state, self.job.model_id)
            step = on_refusal(failure, result.error, waited=now - started, bound=self.settings.move_bound, given_up=given_up,
                              progress_age=progress.age(progress_mark(state, self.job.model_id), now))
            if isinstance(step, GiveUp):
                self.counters.failed += 1
                log.info("api.request_not_moved", task_id=self.task_id, origin=self.job.task_id, error=step.error.message)
                return step.error
            await trio.sleep(step.delay)
            await self._keepalive_if_due(send, started)

    async def _wait_for_replacement(self, submit: SubmitGeneration, result: CommandResult, send: Send) -> CommandResult:
        """A new request refused because its model's instances failed and are being
        re-placed: submitted again (same task id) every ``RETRY_INTERVAL`` s, keep-alives
        meanwhile, until accepted or the rules give up (``on_refusal``: the bound, a model
        given up, another refusal); returns the last answer (``exo_p2p.api.resume``)."""
        started = trio.current_time()
        progress = ProgressAge(started)
        refusal = result.error
        while refusal is not None:
            now, state = trio.current_time(), self.backend.state()
            step = on_refusal(refusal, refusal, waited=now - started, bound=self.settings.move_bound,
                              given_up=model_given_up(state, self.job.model_id),
                              progress_age=progress.age(progress_mark(state, self.job.model_id), now))
            if isinstance(step, GiveUp):
                return result
            await trio.sleep(step.delay)
            await self._keepalive_if_due(send, started)
            # a fresh route per submission: the router ends a route whose task never
            # appears in State (``chunk_router.UNSEEN_BOUND``), and this one is not in it yet
            self.backend.close_chunks(self.task_id)
            self._chunks = self.backend.open_chunks(self.task_id)
            again = msgspec.structs.replace(submit, command_id=new_id())
            result = await self.backend.command(again, timeout=min(self.settings.command_timeout, self.settings.keepalive_interval))
            refusal = result.error
        log.info("api.request_waited_for_replacement", task_id=self.task_id, waited=round(trio.current_time() - started, 2))
        return result

    async def _keepalive_if_due(self, send: Send, quiet_since: float) -> None:
        """During a move: a stream's keep-alive when ``keepalive_interval`` passed without
        bytes (a stream not begun yet is begun, as ``_receive`` does)."""
        if not self.job.stream:
            return
        now = trio.current_time()
        if not self._streaming:
            if now - quiet_since >= self.settings.keepalive_interval:
                await self._begin_stream(send, None)
        elif now - self._last_sent >= self.settings.keepalive_interval:
            await self._send(send, self.encoder.keepalive())

    async def _receive(self, send: Send) -> Chunk:
        """The current task's next chunk; a synthetic ``ErrorChunk`` when none comes within ``chunk_timeout``
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
                assert self._chunks is not None
                try:
                    chunk = await self._chunks.receive()
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

    async def _stream(self, chunk: Chunk, send: Send) -> None:
        if not self._streaming:
            await self._begin_stream(send, chunk.total if isinstance(chunk, PrefillProgressChunk) else None)
        while True:
            if isinstance(chunk, TokenChunk):
                await self._send(send, token_bytes(self.encoder, chunk, self._turn))
            elif isinstance(chunk, FinishChunk):
                self._outcome = f"streamed, {chunk.finish_reason}"
                await self._send(send, finish_bytes(self.encoder, chunk, self._turn), more=False)
                return
            elif isinstance(chunk, ErrorChunk):
                self._outcome = f"error {chunk.error.status} mid-stream"
                await self._send(send, self.encoder.error(chunk.error), more=False)
                return
            elif not isinstance(chunk, PrefillProgressChunk):  # pragma: no cover - a new chunk kind
                log.warning("api.unknown_chunk", kind=type(chunk).__name__)
            chunk = await self._next(send)

    async def _collect(self, chunk: Chunk, send: Send) -> None:
        while True:
            if isinstance(chunk, TokenChunk):
                self._turn.add(chunk)
            elif isinstance(chunk, FinishChunk):
                self._outcome = f"complete, {chunk.finish_reason}"
                await send_bytes(send, 200, answer_bytes(self.encoder, self._turn, chunk))
                return
            elif isinstance(chunk, ErrorChunk):
                self._outcome = f"error {chunk.error.status}"
                await send_error(send, chunk.error, self.encoder.family)
                return
            chunk = await self._next(send)
