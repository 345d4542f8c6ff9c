"""The engine: requests are submitted to it and it is stepped (docs/architecture.md#engine).

``Engine`` owns the parts and decides, step by step, what each does: the ``TaskQueue``
(submitted requests), ``prepare`` (a request into a ``Sequence``, no model work), the
``PrefillSlots`` (the ``PrefillGroup`` prefilled together and the rows paused), the
``DecodeBatch`` (one forward pass per step) and the ``PromptCache``. One path serves every
``max_batch``. ``step`` does one bounded unit of work and returns its chunks (its docstring).

Admission: before each chunk the fairness rule picks the prompts to prefill (``prefill_slots``,
``fair_share``); the queued ones it picks are accepted in its order while each one's KV (prompt
+ its token budget, bounded by the context) fits beside every accepted row's within
``kv_capacity_tokens`` (``batch_memory``); otherwise that one waits (those after it too), and
one that cannot fit even alone ends at once with a 503 ``out_of_memory``.

Ranks: every rank of a multi-rank instance steps the same requests (agreed by the runner's
rounds before each step that accepts or prefills: ``in_prefill``), cancels and tokens, so
every rank holds the same rows in the same order and the stage's collectives meet. Greedy
and seeded output of a request in a batch equals its output alone, token for token.

A request always ends with exactly one ``FinishChunk`` or ``ErrorChunk``; a failing request
never stops the engine from serving the others, but a failed forward pass of a multi-rank
stage raises ``StageFailed`` out of ``step`` (``pipeline.request_error``): the runner fails.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from exo_p2p.types.chunks import Chunk, ErrorChunk, FinishChunk, FinishReason
from exo_p2p.types.common import TaskId
from exo_p2p.types.engine import EngineSettings
from exo_p2p.types.tasks import GenerationParams
from worker.engine.batch_memory import Verdict, join_verdict
from worker.engine.decode_step import consume_tokens
from worker.engine.loading.loader import LoadedModel
from worker.engine.micro import decode_batch
from worker.engine.pipeline import LocalStage, Stage, request_error
from worker.engine.prefill import KvPreset, PrefillGroup, out_of_memory, start_kv
from worker.engine.prefill_slots import PrefillSlots
from worker.engine.prepare import Grammars, failure_chunk, grammars_for, prepare
from worker.engine.prompt_cache import PromptCache
from worker.engine.sequence import Sequence
from worker.engine.task_queue import Queued, TaskQueue


class Engine:
    """One runner's engine (see the module docstring).

    ``settings``: ``prefill_chunk_size`` and ``max_batch`` are read here (the builder turns the
    rest into ``kv_capacity_tokens`` and ``prompt_cache``); ``stage``: this rank's part of each
    step (default: the whole model, ``LocalStage``); ``kv_capacity_tokens``: tokens of KV the
    batch may hold (None: no memory check); ``model_id`` names the model in error messages;
    ``clock``: seconds; ``on_token(task_id, token_id)`` is called for every sampled token,
    end-of-turn included. ``submit``, ``cancel`` and the read-only properties may be called
    from any thread, ``step`` from one thread at a time (the one that drives MLX). Raises
    ``ValueError`` for settings out of range.
    """

    def __init__(self, loaded: LoadedModel, settings: EngineSettings, *, stage: Stage | None = None,
                 kv_capacity_tokens: int | None = None, prompt_cache: PromptCache | None = None,
                 model_id: str = "", clock: Callable[[], float] = time.perf_counter,
                 on_token: Callable[[TaskId, int], None] | None = None) -> None:
        self.loaded = loaded
        self.settings = settings.check()
        self.model_id = model_id or loaded.model_dir.name
        self.stage: Stage = stage if stage is not None else LocalStage()
        self.kv_capacity_tokens = kv_capacity_tokens
        self.prompt_cache = prompt_cache if prompt_cache is not None else PromptCache()
        self.clock = clock
        self.on_token = on_token
        self.queue = TaskQueue()
        self.batch = decode_batch(self.settings)  # DecodeBatch, or MicroBatches (micro.py)
        self.slots = PrefillSlots()  # the group prefilling and the rows paused
        self._submitted = 0  # requests submitted so far: the next one's order
        self.prefilled_tokens = 0  # prompt tokens fed through the model (the prompt cache's saving shows)
        self._live: dict[TaskId, Sequence] = {}  # accepted, unfinished: prefilling or in the batch
        self._outbox: list[Chunk] = []  # ends of requests cancelled while queued
        self._lock = threading.Lock()
        self.grammars: Grammars | None = None  # at the first request with an output format (submit)
        self.presets: dict[TaskId, KvPreset] = {}  # prompts made elsewhere, by task (vision rows: engine.prefill)

    def submit(self, task_id: TaskId, params: GenerationParams) -> None:
        """Queue a request; it is accepted after every request submitted before it."""
        with self._lock:
            self.grammars = grammars_for(params, self.grammars, self.loaded)
            self.queue.push(Queued(task_id, params, self.clock(), self._submitted))
            self._submitted += 1

    def cancel(self, task_id: TaskId) -> bool:
        """Cancel a queued or running request: the next ``step`` returns its
        ``FinishChunk(finish_reason="cancelled")`` and does no more work for it. False when
        the task is unknown or already finished."""
        with self._lock:
            if self.queue.remove(task_id):
                self._outbox.append(FinishChunk(task_id=task_id, finish_reason="cancelled", prompt_tokens=0, completion_tokens=0))
                return True
            seq = self._live.get(task_id)
            if seq is None:
                return False
            seq.cancel_requested = True
            return True

    def has_work(self) -> bool:
        """Whether ``step`` has anything to do: a request queued or running, or chunks to deliver."""
        with self._lock:
            return bool(len(self.queue) or self._outbox or self._live)

    @property
    def batch_size(self) -> int:
        """Sequences accepted and not finished: prefilling or in the batch."""
        with self._lock:
            return len(self._live)

    @property
    def queued_task_ids(self) -> list[TaskId]:
        with self._lock:
            return self.queue.task_ids

    @property
    def prefilling(self) -> PrefillGroup | None:  # the group prefilling now (None: none)
        return self.slots.group

    @property
    def in_prefill(self) -> bool:
        """Whether the next ``step`` accepts a request or prefills a chunk (the runner's
        agreement points are taken before each such step)."""
        with self._lock:
            if self.slots.rows:  # prefilling or paused
                return True
            chosen = self.slots.choice(self.queue.items, self.batch.max_rows - len(self.batch.rows), self.settings.prefill_chunk_size)
            first = next((self.queue.find(t) for t in chosen), None)
            return first is not None and (first.prepared is None or self._verdict(first.prepared) != "wait")

    def _verdict(self, seq: Sequence, forming: list[Sequence] | None = None) -> Verdict:
        """Whether ``seq``'s KV fits beside the batch's and ``forming``'s (default: ``slots.rows``)."""
        if seq.done_before_start:
            return "join"  # nothing left to generate: no KV
        forming = self.slots.rows if forming is None else forming
        rows = self.batch.kv_rows() + [s.kv() for s in forming]
        return join_verdict(seq.kv(), rows, self.kv_capacity_tokens)

    def step(self) -> list[Chunk]:
        """One step, in this order (the same on every rank):

        1. the ends of requests cancelled while queued, and of sequences cancelled since
           the last step;
        2. prefill, within a budget of ``prefill_chunk_size`` prompt tokens a row: the prompts
           the fairness rule picks (``_form_group``) as one ``PrefillGroup`` (one forward pass
           a chunk, at most ``group_limit`` rows, alike in length); rows whose prompts end join
           the batch at once (``split_ready``), and once the whole group has, the next may
           follow; every 8th step one left out for its length is fed a chunk alone (``_feed_alone``);
        3. one decode step of the batch; rows that end leave at once.
        """
        with self._lock:
            out, self._outbox, self.slots.long_fed = self._outbox, [], False
        out += self._end_cancelled()
        out += self._prefill(self.settings.prefill_chunk_size)
        if self.batch.rows:
            out += self._decode()
        return out

    def _end_cancelled(self) -> list[Chunk]:
        out: list[Chunk] = [self._end(s, "cancelled") for s in self.slots.rows if s.cancel_requested]
        gone = [i for i, row in enumerate(self.batch.rows) if row.cancel_requested]
        out += [self._end(self.batch.rows[i], "cancelled") for i in gone]
        self.batch.drop(gone)
        return out

    def _prefill(self, budget: int) -> list[Chunk]:
        out: list[Chunk] = []
        while budget > 0:
            out += self._form_group()
            if (group := self.slots.group) is None or not self.slots.may_feed(group.rows, bool(self.batch.rows)):
                break  # none, or a long prompt's chunk held back for the streams decoding
            before = [s.processed for s in group.rows]
            try:
                out += group.prefill_chunk(self.stage, self.loaded.model, min(self.settings.prefill_chunk_size, budget))
                fed = [s.processed - b for s, b in zip(group.rows, before, strict=True)]
                ready = group.split_ready(self.stage, self.loaded.model)  # rows done before the others
            except Exception as e:  # noqa: BLE001 - these requests fail, the engine goes on
                error = request_error(self.stage, e)
                out += [self._fail(s, error) for s in list(group.rows)]
                continue
            self.prefilled_tokens += sum(fed)
            budget -= max(fed)
            with self._lock:
                for done in [g for g in (ready, group) if g is not None and g.prefilled]:
                    self.slots.join(done, self.batch)
            if self.slots.group is not None:
                break  # the rest of the prompts next step
        return out + self._feed_alone(self.slots.next_turn())

    def _feed_alone(self, seq: Sequence | None) -> list[Chunk]:
        """A chunk of ``seq``'s prompt on its own (left out of the group for its length, on
        its turn: ``PrefillSlots.next_turn``); it joins the batch once prefilled."""
        if seq is None or not self.slots.may_feed([seq], bool(self.batch.rows)):
            return []
        before = seq.processed
        try:
            out = seq.prefill_chunk(self.stage, self.loaded.model, self.settings.prefill_chunk_size)
        except Exception as e:  # noqa: BLE001 - this request fails, the engine goes on
            return [self._fail(seq, request_error(self.stage, e))]
        self.prefilled_tokens += seq.processed - before
        with self._lock:
            self.slots.join_alone(seq, self.batch)  # once prefilled
        return out

    def _form_group(self) -> list[Chunk]:
        """Apply the fairness rule's pick (``PrefillSlots.choice``): pause the rows it drops, take back the
        paused and accept the queued ones it picks (in its order, while their KV fits), and
        arrange them (``PrefillSlots.arrange``: the group, or left out for length); their chunks."""
        with self._lock:
            chosen = self.slots.choice(self.queue.items, self.batch.max_rows - len(self.batch.rows), self.settings.prefill_chunk_size)
            self.slots.pause_except(set(chosen))
            resumed = self.slots.resume(chosen)
            queued = [q for t in chosen if (q := self.queue.find(t)) is not None]
        out: list[Chunk] = []
        accepted: list[Sequence] = []
        for item in queued:
            chunks, seq, go_on = self._accept(item, self.slots.rows + resumed + accepted)
            out, accepted = out + chunks, accepted + ([seq] if seq is not None else [])
            if not go_on:
                break
        with self._lock:
            self.slots.arrange(chosen, resumed + accepted)
        return out

    def _accept(self, queued: Queued, forming: list[Sequence]) -> tuple[list[Chunk], Sequence | None, bool]:
        """Accept ``queued`` beside the rows ``forming`` when its KV fits: its chunks, the
        sequence accepted (None: none), and whether to try the next pick (False: it waits)."""
        try:
            preset = self.presets.get(queued.task_id)
            seq = queued.prepared or prepare(queued.task_id, queued.params, self.loaded, model_id=self.model_id,
                                             submitted_at=queued.submitted_at, grammars=self.grammars, ids=preset and preset.ids)
        except Exception as e:  # noqa: BLE001 - this request fails, the engine goes on
            seq = failure_chunk(queued.task_id, e)
        if isinstance(seq, ErrorChunk):
            return self._pop(queued, [seq]), None, True
        queued.prepared = seq
        verdict = self._verdict(seq, forming)
        if verdict == "wait":
            return [], None, False
        if verdict == "never":
            return self._pop(queued, [out_of_memory(seq, self.kv_capacity_tokens, self.model_id)]), None, True
        if seq.done_before_start:  # every allowed token was sent before the move
            return self._pop(queued, [seq.progress(), seq.finish("length")]), None, True
        with self._lock:
            if not self.queue.pop(queued):
                return [], None, True  # cancelled meanwhile: its end is in the outbox
            self._live[seq.task_id], seq.accepted_at = seq, self.clock()
            self.slots.accept(seq, queued.order)
        try:
            start_kv(seq, self.prompt_cache, self.loaded.model, self.settings.kv_cache_bits, self.presets.pop(seq.task_id, None))
        except Exception as e:  # noqa: BLE001
            return [self._fail(seq, request_error(self.stage, e))], None, True
        return [seq.progress()], seq, True

    def _pop(self, queued: Queued, chunks: list[Chunk]) -> list[Chunk]:
        with self._lock:  # the chunks when ``queued`` still waited (now removed), else none (cancelled)
            return chunks if self.queue.pop(queued) else []

    def _decode(self) -> list[Chunk]:
        """One decode step of the batch: every row's token consumed; rows that end leave
        (their KV kept by the prompt cache when it is on)."""
        try:
            tokens = self.batch.decode(self.stage, self.loaded.model)
        except Exception as e:  # noqa: BLE001 - the batch's forward failed: every row fails
            error = request_error(self.stage, e)
            out = [self._fail(row, error) for row in self.batch.rows]
            self.batch.drop(list(range(len(self.batch.rows))))
            return out
        out, ended = consume_tokens(self.batch.rows, tokens, self.clock(), self.on_token)
        for i, exc in ended:
            row = self.batch.rows[i]
            if exc is not None:
                out.append(self._fail(row, exc))
                continue
            with self._lock:
                self._live.pop(row.task_id, None)
            if self.prompt_cache.enabled:
                self.prompt_cache.insert(row.tokens(), self.batch.extract(i), row.params)
        self.batch.drop([i for i, _ in ended])
        return out

    def _end(self, seq: Sequence, reason: FinishReason) -> FinishChunk:
        self._forget(seq)
        return seq.finish(reason)

    def _fail(self, seq: Sequence, exc: Exception) -> ErrorChunk:
        self._forget(seq)
        return failure_chunk(seq.task_id, exc)

    def _forget(self, seq: Sequence) -> None:
        """``seq`` is no longer live, nor prefilling or paused (its KV rows freed)."""
        with self._lock:
            self._live.pop(seq.task_id, None)
            self.slots.discard(seq)
