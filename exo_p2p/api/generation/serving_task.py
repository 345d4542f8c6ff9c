"""The task serving one generation request on the cluster, across moves: its submission, its
chunks, its cancel, and moving it when it fails on the serving side.

A request is served by one task at a time. A task that fails on the serving side (its
instance's node or runner died, chunks were lost) is replaced by a continuation task that
resumes from the token ids already handed to the client; a new request refused while its
model's instances are being re-placed is submitted again until accepted. Both wait within
the bounds of ``exo_p2p.api.generation.resume`` (whose pure rules decide every step), with keep-alives
on the client's stream meanwhile (``exo_p2p.api.generation.client_stream``).
"""

from __future__ import annotations

import msgspec
import structlog
import trio

from exo_p2p.api.backend import ApiBackend
from exo_p2p.api.demand.placer import waits
from exo_p2p.api.generation.client_stream import ClientStream
from exo_p2p.api.errors import error_info
from exo_p2p.api.generation.job import GenerationJob, GenerationSettings, new_task_id
from exo_p2p.api.generation.replacement_progress import ProgressAge, progress_mark
from exo_p2p.api.generation.request_trace import RequestTrace
from exo_p2p.api.generation.resume import (
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
from exo_p2p.types import (
    CancelGeneration,
    Chunk,
    CommandResult,
    ErrorChunk,
    ErrorInfo,
    FinishChunk,
    NodeId,
    SubmitTask,
    TokenChunk,
    new_id,
)

log = structlog.get_logger("exo_p2p.api")


class ServingTask:
    """The current task of one request (``task_id``; the job's own until it moves).

    Contract: ``open`` before ``submit``; ``end`` always, last (it cancels a task submitted
    and not ended, shielded and bounded by ``cancel_timeout``, and closes its chunks).
    ``next`` returns the next chunk for the client, never raises for a failed task: a
    failure that cannot move, no chunk within ``chunk_timeout`` (504) or a channel closed
    without a last chunk (503) comes back as an ``ErrorChunk``. Moves are counted in
    ``counters`` and recorded in ``trace``.
    """

    def __init__(self, backend: ApiBackend, job: GenerationJob, settings: GenerationSettings, out: ClientStream,
                 trace: RequestTrace, counters: MoveCounters) -> None:
        self._backend = backend
        self._job = job
        self._settings = settings
        self._out = out
        self._trace = trace
        self.counters = counters
        self.task_id = job.task_id
        self.submitted = False
        self.ended = False
        """Whether the current task ended (its last chunk came, or it was refused)."""
        self._chunks: trio.MemoryReceiveChannel[Chunk] | None = None
        self._sent_tokens: list[int] = []
        """Token ids of the chunks handed to the client so far (what a move resumes from)."""
        self._moves = 0
        self._instance_id: str | None = None
        """The instance the master gave the current task to."""

    def open(self) -> None:
        """Open the current task's chunk channel (before it is submitted)."""
        self._chunks = self._backend.open_chunks(self.task_id)

    async def end(self) -> None:
        """Cancel the current task when it was submitted and has not ended; close its chunks."""
        if self.submitted and not self.ended:
            await self.cancel()
        self._backend.close_chunks(self.task_id)

    async def cancel(self) -> None:
        """Send ``CancelGeneration`` for the current task (shielded, within ``cancel_timeout``);
        a refusal or failure is logged, never raised."""
        command = CancelGeneration(command_id=new_id(), task_id=self.task_id)
        with trio.CancelScope(shield=True), trio.move_on_after(self._settings.cancel_timeout):
            try:
                result = await self._backend.command(command, timeout=self._settings.cancel_timeout)
                if result.error is not None:
                    log.info("api.cancel_refused", task_id=self.task_id, error=result.error.message)
            except Exception:  # the client is gone; nobody to tell but the log
                log.exception("api.cancel_failed", task_id=self.task_id)

    async def submit(self) -> CommandResult:
        """Submit the job's ``SubmitTask``; when refused because its model is being
        re-placed, again until accepted or the rules give up. Returns the last answer (its
        error set: the task ended, refused)."""
        submit = SubmitTask.generation(
            command_id=new_id(),
            task_id=self.task_id,
            model_id=self._job.model_id,
            params=self._job.params,
            api_node_id=NodeId(self._backend.node_id),
        )
        submit = msgspec.structs.replace(submit, keep_alive=self._job.keep_alive)
        self.submitted = True
        result = await self._backend.command(submit, timeout=self._settings.command_timeout)
        if result.error is not None and self._settings.demand is not None and waits(result.error, self._backend.state(), self._job.model_id):
            result = await self._on_demand(submit, result)
        if result.error is not None and self._settings.max_moves and waits_for_replacement(result.error, self._backend.state(), self._job.model_id):
            result = await self._wait_for_replacement(submit, result)
        self._instance_id = result.instance_id
        self._trace.routed(result)
        self._out.instance = self._out.instance or result.instance_id
        if result.error is not None:
            self.ended = True
        return result

    async def next(self) -> Chunk:
        """The next chunk for the client, across moves: a movable failure of the current
        task is replaced by the continuation's chunks (``_move``), or by the error to answer
        when the request cannot move. Records the token ids handed out."""
        while True:
            chunk = await self._receive()
            if isinstance(chunk, ErrorChunk) and self._settings.max_moves and suspect(chunk.error) and await self._instance_fails():
                info = chunk.error
                chunk = ErrorChunk(task_id=chunk.task_id, error=ErrorInfo(503, info.message, info.type, info.param, MOVABLE_CODE))
            if isinstance(chunk, ErrorChunk) and movable(chunk.error):
                error = await self._move(chunk.error)
                if error is None:
                    continue
                return ErrorChunk(task_id=self.task_id, error=error)
            if isinstance(chunk, TokenChunk) and chunk.token_id is not None:
                self._sent_tokens.append(chunk.token_id)
            self._trace.chunk(chunk)
            return chunk

    async def _instance_fails(self) -> bool:
        """Whether the current task's instance fails within ``fail_wait`` seconds (polled
        from State; keep-alives meanwhile)."""
        started = trio.current_time()
        while trio.current_time() - started < self._settings.fail_wait:
            if instance_failed(self._backend.state(), self._instance_id):
                return True
            await trio.sleep(0.25)
            await self._out.keepalive_if_due(started)
        return False

    async def _move(self, failure: ErrorInfo) -> ErrorInfo | None:
        """Move the request after its task failed with ``failure``: submit continuations
        until one is accepted (None) or the rules give up (the error to answer)."""
        settings, job = self._settings, self._job
        decision = on_failure(failure, tuple(self._sent_tokens), self._moves, settings.max_moves)
        if isinstance(decision, GiveUp):
            self.counters.failed += 1
            return decision.error
        started = trio.current_time()
        if self._out.streaming:  # the waits below are bounded (5 s each): start each silence afresh
            await self._out.keepalive()
        await self.cancel()  # the failed task may still run (chunks lost on the way)
        self._backend.close_chunks(self.task_id)
        params = msgspec.structs.replace(job.params, resume_tokens=decision.resume_tokens, origin_task_id=job.task_id)
        progress = ProgressAge(trio.current_time())
        while True:
            task_id = new_task_id()
            # the continuation is the current task from its submission on: a disconnect
            # while the master answers cancels it
            self.task_id, self._chunks, self.ended = task_id, self._backend.open_chunks(task_id), False
            submit = SubmitTask.generation(command_id=new_id(), task_id=task_id, model_id=job.model_id, params=params,
                                      api_node_id=NodeId(self._backend.node_id))
            # bounded by the keep-alive interval, so a stream is never silent for long
            timeout = min(settings.command_timeout, settings.keepalive_interval)
            await self._out.keepalive_if_due(started)
            result = await self._backend.command(submit, timeout=timeout)
            if result.error is None:
                self._moved(result, task_id, failure, len(decision.resume_tokens))
                return None
            self._backend.close_chunks(task_id)
            self.ended = True
            now = trio.current_time()
            state = self._backend.state()
            step = on_refusal(failure, result.error, waited=now - started, bound=settings.move_bound,
                              given_up=model_given_up(state, job.model_id),
                              progress_age=progress.age(progress_mark(state, job.model_id), now))
            if isinstance(step, GiveUp):
                self.counters.failed += 1
                log.info("api.request_not_moved", task_id=self.task_id, origin=job.task_id, error=step.error.message)
                return step.error
            await trio.sleep(step.delay)
            await self._out.keepalive_if_due(started)

    def _moved(self, result: CommandResult, task_id: str, failure: ErrorInfo, resumed_tokens: int) -> None:
        """Record an accepted continuation: its instance, the move counted and traced, logged."""
        self._instance_id = result.instance_id
        self._moves += 1
        self.counters.moved += 1
        self._trace.routed(result)
        self._trace.moves = self._moves
        log.info("api.request_moved", task_id=task_id, origin=self._job.task_id, instance_id=result.instance_id,
                 resumed_tokens=resumed_tokens, moves=self._moves, reason=failure.message)

    async def _wait_for_replacement(self, submit: SubmitTask, result: CommandResult) -> CommandResult:
        """A new request refused because its model's instances failed and are being
        re-placed: submitted again (same task id) every ``RETRY_INTERVAL`` s, keep-alives
        meanwhile, until accepted or the rules give up (``on_refusal``: the bound, a model
        given up, another refusal); returns the last answer (``exo_p2p.api.generation.resume``)."""
        settings, model_id = self._settings, self._job.model_id
        started = trio.current_time()
        progress = ProgressAge(started)
        refusal = result.error
        while refusal is not None:
            now, state = trio.current_time(), self._backend.state()
            step = on_refusal(refusal, refusal, waited=now - started, bound=settings.move_bound,
                              given_up=model_given_up(state, model_id),
                              progress_age=progress.age(progress_mark(state, model_id), now))
            if isinstance(step, GiveUp):
                return result
            await trio.sleep(step.delay)
            await self._out.keepalive_if_due(started)
            # a fresh route per submission: the router ends a route whose task never
            # appears in State (``chunk_router.UNSEEN_BOUND``), and this one is not in it yet
            self._backend.close_chunks(self.task_id)
            self._chunks = self._backend.open_chunks(self.task_id)
            again = msgspec.structs.replace(submit, command_id=new_id())
            result = await self._backend.command(again, timeout=min(settings.command_timeout, settings.keepalive_interval))
            refusal = result.error
        log.info("api.request_waited_for_replacement", task_id=self.task_id, waited=round(trio.current_time() - started, 2))
        return result

    async def _on_demand(self, submit: SubmitTask, result: CommandResult) -> CommandResult:
        """A request for a model with no ready instance: placed on demand and waited for
        (keep-alives meanwhile; ``exo_p2p.api.demand.placer``), then submitted again."""
        assert self._settings.demand is not None
        started = trio.current_time()
        error = await self._settings.demand.ready(self._backend, self._job.model_id, self._job.keep_alive,
                                                  lambda: self._out.keepalive_if_due(started))
        if error is not None:
            return CommandResult(submit.command_id, error=error)
        self._backend.close_chunks(self.task_id)  # a fresh route: the first one may have been swept meanwhile
        self._chunks = self._backend.open_chunks(self.task_id)
        again = msgspec.structs.replace(submit, command_id=new_id())
        return await self._backend.command(again, timeout=self._settings.command_timeout)

    async def _receive(self) -> Chunk:
        """The current task's next chunk; a synthetic ``ErrorChunk`` when none comes within ``chunk_timeout``
        (504) or the node closed the channel without a last chunk (503). A stream gets a
        keep-alive after every ``keepalive_interval`` without bytes (and is begun by the
        first one when it has not begun yet)."""
        deadline = trio.current_time() + self._settings.chunk_timeout
        while True:
            now = trio.current_time()
            wait = deadline - now
            if self._job.stream:
                wait = min(wait, self._out.until_keepalive(now))
            with trio.move_on_after(wait):
                assert self._chunks is not None
                try:
                    chunk = await self._chunks.receive()
                except (trio.EndOfChannel, trio.ClosedResourceError):
                    info = error_info(503, "the generation ended without a result (the node lost the task)")
                    return ErrorChunk(task_id=self.task_id, error=info)
                if isinstance(chunk, (FinishChunk, ErrorChunk)):
                    self.ended = True
                return chunk
            if trio.current_time() >= deadline:
                message = f"no output from the model for {self._settings.chunk_timeout:g} s"
                return ErrorChunk(task_id=self.task_id, error=error_info(504, message, code="timeout"))
            await self._out.begin_or_keepalive()
