"""The generator: chat-completion requests are submitted to it and it is stepped.

With ``max_batch`` 1 requests are served one after another in submission order; with
``max_batch`` > 1 they are batched (continuous batching: see "The batch" below). Each
``step()`` does one bounded unit of work and returns the chunks it produced:

1. accept the next queued request: apply the chat template, check it against the context,
   and return ``PrefillProgressChunk(processed=0)`` — or an ``ErrorChunk`` (HTTP 400) before
   any model work when the model has no chat template, the template fails, or
   the prompt does not fit the context;
2. prefill one chunk of at most ``prefill_chunk_size`` prompt tokens (as mlx-lm's
   ``generate_step``: every prompt token but the last, in chunks; the last one yields the
   first token), returning ``PrefillProgressChunk(processed, total)``;
3. decode one token, returning a ``TokenChunk`` (and a ``FinishChunk`` at the end).

Decode pipelines like ``mlx_lm.generate.generate_step``: the next token's graph is built and
``mx.async_eval``-ed before the current token is read with ``.item()``, so the model runs
while Python detokenizes and matches stop strings.

Context rule (documented choice): a prompt of N tokens needs N < context; otherwise 400
"prompt is N tokens but the model's context is M tokens". When N + max_tokens exceeds the
context, max_tokens is clamped to context − N and generation ends with finish_reason
"length" there; no max_tokens (None) means until the model stops or the context is full.
A request with a raw ``prompt`` is tokenized as is (no chat template, no template needed).

Resuming (``exo_p2p.api.resume``): a request with ``resume_tokens`` (the tokens an earlier task of it
generated and sent) prefills prompt + those tokens (the same context rule: they count against
the context), replays them through the detokenizer and the stop matcher without emitting
their text (the client has it), starts ``completion_tokens`` at their count and the sampler at
their position, so the continuation equals the uninterrupted run; ``prompt_tokens`` in its
``FinishChunk`` is the original prompt's.
The batch (``max_batch`` > 1): a request is accepted when nothing prefills and fewer than
``max_batch`` sequences decode; it prefills alone (its own KV cache, batch size 1), one chunk
per step, then joins the batch as its last row (mlx-lm's left-padded ``BatchKVCache``: the
padding is masked, each row keeps its own RoPE offset). Each step feeds every row its last
token in one forward pass ``[B, 1]`` and samples row ``i`` with its own ``Sampler``; a row that
ends (end-of-turn, stop string, max_tokens, cancel) leaves at once and its KV rows are
dropped. Greedy and seeded output equals the request's output alone, token for token
(tests/test_batch.py). Every rank of a multi-rank instance holds the same rows in the same
order: the steps only depend on the agreed requests, cancels and the shared tokens.
Memory: a request joins only when the KV it can grow to (prompt + its token budget, bounded
by the context) fits beside the batch's within ``kv_capacity_tokens``
(``worker.engine.batch_memory``); otherwise it waits at the head of the queue (later requests
wait behind it: first come, first served), and one that cannot fit even alone ends at once
with a 503 ``out_of_memory``.
Choice (not measured against per-sequence caches): left-padding, since one batched
attention call per layer keeps the decode step one forward pass; the padding costs at most
the length difference between the longest and the shortest row.

Counting: ``completion_tokens`` counts generated tokens whose text is (or would be) output,
up to and including the token that completes a stop string; an end-of-turn token is not
counted. ``ttft`` is seconds from ``submit`` to the first token (queueing included);
``decode_tokens_per_second`` is ``(completion_tokens − 1) / (t_last − t_first)``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from exo_p2p.types.chunks import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    FinishReason,
    PrefillProgressChunk,
    TokenChunk,
)
from exo_p2p.types.common import ErrorInfo, TaskId
from exo_p2p.types.tasks import ChatMessage, GenerationParams
from worker.engine.batch_memory import RowKV, join_verdict, peak_batch_tokens
from worker.engine.forward import Forward, forward, generation_stream, new_cache
from worker.engine.loader import LoadedModel
from worker.engine.pipeline import LocalStage, Stage
from worker.engine.sampling import Sampler, seed_for
from worker.engine.stop import StopMatcher

DEFAULT_PREFILL_CHUNK_SIZE = 256
"""Prompt tokens per prefill step (tokens)."""


@dataclass(frozen=True)
class GenerationRequest:
    """One chat completion to run. ``messages`` are ChatMessage or role/content mappings;
    ``max_tokens`` counts completion tokens (None: until the model stops or the context is
    full); ``temperature`` 0 is greedy; ``seed`` None → derived from ``task_id`` (see
    ``sampling.seed_for``); the other sampling fields are ``GenerationParams``'; ``prompt``
    (raw text, no chat template) replaces ``messages`` when set."""

    task_id: TaskId
    messages: Sequence[ChatMessage | Mapping[str, str]]
    max_tokens: int | None = None
    temperature: float = 0.7
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    penalty_context: int = 64
    logit_bias: tuple[tuple[int, float], ...] = ()
    prompt: str | None = None
    resume_tokens: tuple[int, ...] = ()
    origin_task_id: str | None = None

    @classmethod
    def from_params(cls, task_id: TaskId, params: GenerationParams) -> GenerationRequest:
        """The request for a ``TextGeneration`` task's parameters."""
        return cls(
            task_id=task_id,
            messages=params.messages,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            stop=tuple(params.stop),
            seed=params.seed,
            top_k=params.top_k,
            min_p=params.min_p,
            presence_penalty=params.presence_penalty,
            frequency_penalty=params.frequency_penalty,
            repetition_penalty=params.repetition_penalty,
            penalty_context=params.penalty_context,
            logit_bias=tuple(params.logit_bias),
            prompt=params.prompt,
            resume_tokens=tuple(params.resume_tokens),
            origin_task_id=params.origin_task_id,
        )

    def chat_messages(self) -> list[dict[str, str]]:
        """The messages as the dicts a chat template takes."""
        out = []
        for m in self.messages:
            if isinstance(m, ChatMessage):
                out.append({"role": m.role, "content": m.content})
            else:
                out.append({"role": str(m["role"]), "content": str(m["content"])})
        return out


@dataclass
class _Active:
    """The request being served and its generation state."""

    request: GenerationRequest
    submitted_at: float
    prompt: mx.array  # [N] int32
    max_new: int
    cache: list[Any]
    sampler: Sampler
    detokenizer: Any
    stops: StopMatcher
    processed: int = 0
    next_token: mx.array | None = None  # lazy, async-evaluated
    completion_tokens: int = 0
    t_first: float | None = None
    t_last: float | None = None
    cancel_requested: bool = False
    resumed: int = 0
    """Tokens of ``prompt`` that were generated by an earlier task of this request."""
    fed: list[int] = field(default_factory=list)  # tokens in the KV after the prompt (batch path)
    reused: int = 0  # prompt tokens taken from the prompt cache

    @property
    def prompt_tokens(self) -> int:
        """The original prompt's tokens (without resumed ones)."""
        return int(self.prompt.size) - self.resumed

    def kv(self) -> RowKV:
        """The KV (tokens) this sequence holds once in the batch and may still add: its
        prompt (resumed tokens included) and the tokens fed after it; at most the prompt
        plus ``max_new`` (clamped to the context) in all (``batch_memory``)."""
        used = int(self.prompt.size) + len(self.fed)
        final = int(self.prompt.size) + self.max_new - self.resumed
        return RowKV(used, max(0, final - used))


@dataclass
class _CachedPrefix:
    """A finished sequence's KV: the ``tokens`` it holds and one ``KVCache`` per layer."""

    tokens: list[int]
    cache: list[Any]
    nbytes: int


@dataclass
class _Queued:
    request: GenerationRequest
    submitted_at: float
    prepared: _Active | None = None
    """Tokenized and checked, waiting for room in the batch's KV (batch path)."""


def _error(task_id: TaskId, status: int, message: str, *, param: str | None = None,
           code: str | None = None) -> ErrorChunk:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return ErrorChunk(task_id=task_id, error=ErrorInfo(status=status, message=message,
                                                       type=kind, param=param, code=code))


def validate_prompt(prompt_tokens: int, max_tokens: int | None, context_length: int) -> str | None:
    """The context rule: None when a prompt of ``prompt_tokens`` may run, else the 400
    message. ``max_tokens`` beyond what is left is clamped, not an error (None: no limit)."""
    if prompt_tokens >= context_length:
        return f"prompt is {prompt_tokens} tokens but the model's context is {context_length} tokens"
    if prompt_tokens < 1:
        return "the prompt is empty"
    if max_tokens is not None and max_tokens < 1:
        return f"max_tokens must be at least 1, not {max_tokens}"
    return None


@dataclass
class Generator:
    """Serves submitted generation requests one after another, one bounded step at a time.

    ``submit`` and ``cancel`` may be called from any thread; ``step`` from one thread at a
    time (the one that drives MLX). A request always ends with exactly one ``FinishChunk``
    or ``ErrorChunk``; a failing request never stops the generator from serving the next.
    ``forward`` computes logits from tokens and the KV cache; ``stage`` (default: a
    ``LocalStage`` over ``forward``) is one rank's part of each step — a ``PipelineStage``
    makes this generator one rank of a pipeline, stepped in lockstep with its peers;
    ``model_id`` names the model in error messages; ``on_token(task_id, token_id)`` is called
    for every sampled token, end-of-turn included (tests, pipeline checks).
    """

    loaded: LoadedModel
    model_id: str = ""
    prefill_chunk_size: int = DEFAULT_PREFILL_CHUNK_SIZE
    forward: Forward = forward
    clock: Callable[[], float] = time.perf_counter
    on_token: Callable[[TaskId, int], None] | None = None
    stage: Stage | None = None
    max_batch: int = 1
    prompt_cache_bytes: int = 0
    """Bytes of finished sequences' KV kept for reuse (LRU; 0: no prompt cache). Batch path on
    a single rank only (``LocalStage``): ranks would have to agree on the reused length."""
    kv_capacity_tokens: int | None = None
    """Tokens of KV the batch may hold (``batch_memory``: the same on every rank; the runner
    sets it from its KV budget); None: no memory check. A sequence joins only when the KV it
    can grow to fits beside the batch's, else waits; one that cannot fit alone is refused
    with a 503 ``out_of_memory``."""
    _queue: deque[_Queued] = field(default_factory=deque, init=False, repr=False)
    _outbox: list[Chunk] = field(default_factory=list, init=False, repr=False)
    _active: _Active | None = field(default=None, init=False, repr=False)
    _accepting: TaskId | None = field(default=None, init=False, repr=False)
    _accepting_cancelled: bool = field(default=False, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _prefilling: _Active | None = field(default=None, init=False, repr=False)
    _rows: list[_Active] = field(default_factory=list, init=False, repr=False)
    _batch_cache: list[Any] | None = field(default=None, init=False, repr=False)
    _batch_y: mx.array | None = field(default=None, init=False, repr=False)
    _prefixes: OrderedDict[int, _CachedPrefix] = field(default_factory=OrderedDict, init=False, repr=False)
    prompt_cache_tokens: int | None = None
    """The prompt cache's bound in tokens (a multi-rank instance: the smallest rank's, agreed,
    so every rank keeps and evicts the same entries); None: ``prompt_cache_bytes`` bounds it."""
    reuse_gather: Callable[[np.ndarray], np.ndarray] | None = None
    """A multi-rank instance's all-gather (``int64 [W] -> [world, W]``, a collective): the
    prompt cache is then used on every rank and the reused prefix length is rank 0's, agreed
    at each accept (the same step on every rank). None on a single rank."""
    _prefix_keys: int = field(default=0, init=False, repr=False)
    prefilled_tokens: int = field(default=0, init=False)
    """Prompt tokens fed through the model so far (the prompt cache's saving shows here)."""

    def __post_init__(self) -> None:
        if self.prefill_chunk_size < 1:
            raise ValueError(f"prefill_chunk_size must be >= 1, not {self.prefill_chunk_size}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, not {self.max_batch}")
        if not self.model_id:
            self.model_id = self.loaded.model_dir.name
        self._eos = frozenset(self.loaded.eos_token_ids)
        if self.stage is None:
            self.stage = LocalStage(self.forward)

    # -- control (any thread) ------------------------------------------------------------

    def submit(self, request: GenerationRequest) -> None:
        """Queue ``request``; it is served after every request submitted before it."""
        with self._lock:
            self._queue.append(_Queued(request, self.clock()))

    def cancel(self, task_id: TaskId) -> bool:
        """Cancel a queued or running request: the next ``step`` returns its
        ``FinishChunk(finish_reason="cancelled")`` without doing more work for it. Returns
        False when the task is unknown or already finished."""
        with self._lock:
            for q in self._queue:
                if q.request.task_id == task_id:
                    self._queue.remove(q)
                    self._outbox.append(FinishChunk(task_id=task_id, finish_reason="cancelled",
                                                    prompt_tokens=0, completion_tokens=0))
                    return True
            for running in self._running():
                if running.request.task_id == task_id:
                    running.cancel_requested = True
                    return True
            if self._accepting == task_id:  # being accepted by step() right now
                self._accepting_cancelled = True
                return True
        return False

    def has_work(self) -> bool:
        """Whether ``step`` has anything to do (a request queued or running, or chunks to
        deliver)."""
        with self._lock:
            return bool(self._queue or self._outbox or self._running())

    def _running(self) -> list[_Active]:
        """Every accepted, unfinished sequence (call with the lock held)."""
        running = list(self._rows)
        for one in (self._active, self._prefilling):
            if one is not None:
                running.append(one)
        return running

    @property
    def batch_size(self) -> int:
        """Sequences accepted and not finished: decoding in the batch or prefilling."""
        with self._lock:
            return len(self._running())

    @property
    def in_prefill(self) -> bool:
        """Whether the next ``step`` accepts a request or prefills a chunk (agreement points
        are taken before each of these steps)."""
        with self._lock:
            if self.max_batch > 1:
                return self._prefilling is not None or (bool(self._queue) and self._room())
            active = self._active
            return (active is None and bool(self._queue)) or (active is not None and active.next_token is None)

    def _room(self) -> bool:
        """Whether a queued request may be accepted now (lock held): nothing prefilling,
        fewer than ``max_batch`` sequences in the batch, and the head of the queue is not
        waiting for KV memory (``_verdict``)."""
        if self._prefilling is not None or len(self._rows) >= self.max_batch:
            return False
        head = self._queue[0].prepared if self._queue else None
        return head is None or self._verdict(head) != "wait"

    def _verdict(self, candidate: _Active) -> str:
        """``batch_memory.join_verdict`` of ``candidate`` against the batch's rows."""
        if candidate.completion_tokens >= candidate.max_new:
            return "join"  # a resumed request with nothing left to generate: no KV
        return join_verdict(candidate.kv(), [row.kv() for row in self._rows], self.kv_capacity_tokens)

    def _out_of_memory(self, candidate: _Active) -> ErrorChunk:
        need = peak_batch_tokens([candidate.kv()])
        req = candidate.request
        return _error(req.task_id, 503,
                      f"out of memory: the prompt ({candidate.prompt_tokens} tokens) and its token budget "
                      f"({candidate.max_new} tokens: max_tokens or the context) need up to {need} tokens of KV cache, "
                      f"but the runners of model {self.model_id} can hold {self.kv_capacity_tokens} tokens; "
                      "shorten the prompt or lower max_tokens", param="messages", code="out_of_memory")

    @property
    def active_task_id(self) -> TaskId | None:
        active = self._active
        return None if active is None else active.request.task_id

    @property
    def queued_task_ids(self) -> list[TaskId]:
        with self._lock:
            return [q.request.task_id for q in self._queue]

    # -- work (one thread) ---------------------------------------------------------------

    def step(self) -> list[Chunk]:
        """Do one bounded unit of work (accept a request, one prefill chunk, or one decode
        step) and return the chunks produced, in order. With ``max_batch > 1`` one step is
        the batch's step (see ``_batch_step``)."""
        if self.max_batch > 1:
            return self._batch_step()
        with self._lock:
            out, self._outbox = self._outbox, []
            active = self._active
            queued = self._queue.popleft() if active is None and self._queue else None
            if queued is not None:
                self._accepting, self._accepting_cancelled = queued.request.task_id, False
        if active is not None and active.cancel_requested:
            out.append(self._finish(active, "cancelled"))
            return out
        task_id = active.request.task_id if active is not None else None
        try:
            if active is None:
                if queued is not None:
                    task_id = queued.request.task_id
                    out.append(self._accept(queued))
            elif active.next_token is None:
                out.extend(self._prefill_step(active))
            else:
                out.extend(self._decode_step(active))
        except Exception as e:  # a broken request must not stop the generator
            self._end()
            assert task_id is not None
            out.append(_error(task_id, 500, f"generation failed: {e!r}"))
        finally:
            if queued is not None:
                with self._lock:
                    self._accepting = None
        return out

    def _accept(self, queued: _Queued) -> Chunk:
        prepared = self._prepare(queued)
        if isinstance(prepared, _Active):
            return self._start(prepared)
        return prepared

    def _prepare(self, queued: _Queued) -> _Active | ErrorChunk:
        """Tokenize and check ``queued`` and make its generation state (no model work); an
        ``ErrorChunk`` when it cannot run (see the module docstring)."""
        req, tok = queued.request, self.loaded.tokenizer
        if req.prompt is not None:
            ids = list(tok.encode(req.prompt))
        elif not tok.has_chat_template:
            return _error(req.task_id, 400, f"model {self.model_id} has no chat template",
                          param="messages", code="no_chat_template")
        else:
            try:
                ids = tok.apply_chat_template(req.chat_messages(), add_generation_prompt=True)
            except Exception as e:
                return _error(req.task_id, 400,
                              f"the chat template of model {self.model_id} failed: {e}",
                              param="messages")
        if problem := validate_prompt(len(ids), req.max_tokens, self.loaded.context_length):
            code = "context_length_exceeded" if "context" in problem else None
            param = "messages" if code else "max_tokens"
            return _error(req.task_id, 400, problem, param=param, code=code)
        if req.temperature < 0:
            return _error(req.task_id, 400, f"temperature must be >= 0, not {req.temperature}",
                          param="temperature")
        vocab = self._vocab_size() if req.logit_bias else 0
        for token_id, _bias in req.logit_bias:
            if not 0 <= token_id < vocab:
                return _error(req.task_id, 400, f"logit_bias token id {token_id} is not in the "
                              f"vocabulary of model {self.model_id} (0..{vocab - 1})", param="logit_bias")
        left = self.loaded.context_length - len(ids)
        max_new = left if req.max_tokens is None else min(req.max_tokens, left)
        resumed = list(req.resume_tokens)
        if resumed and (len(resumed) > max_new or not all(isinstance(t, int) and t >= 0 for t in resumed)):
            return _error(req.task_id, 400, f"cannot resume after {len(resumed)} tokens: at most {max_new} "
                          "completion tokens fit (max_tokens or the context)", param="resume_tokens")
        prompt = mx.array(ids + resumed, dtype=mx.int32)
        seed = seed_for(req.origin_task_id or req.task_id, req.seed)
        active = _Active(
            request=req,
            submitted_at=queued.submitted_at,
            prompt=prompt,
            max_new=max_new,
            cache=new_cache(self.loaded.model),
            sampler=Sampler(req.temperature, req.top_p, seed,
                            top_k=req.top_k, min_p=req.min_p,
                            presence_penalty=req.presence_penalty,
                            frequency_penalty=req.frequency_penalty,
                            repetition_penalty=req.repetition_penalty,
                            penalty_context=req.penalty_context,
                            logit_bias=req.logit_bias, prompt=prompt),
            detokenizer=tok.detokenizer,
            stops=StopMatcher(req.stop),
            resumed=len(resumed),
            completion_tokens=len(resumed),
        )
        for token in resumed:  # the state the stream had when it moved; its text was sent
            active.detokenizer.add_token(token)
            active.stops.feed(active.detokenizer.last_segment)
        return active

    def _start(self, active: _Active) -> Chunk:
        """Serve the prepared ``active`` (it prefills from the next step on)."""
        req = active.request
        prompt_ids = active.prompt_tokens
        ids = [int(t) for t in active.prompt.tolist()] if self._caching else []
        if active.resumed and active.completion_tokens >= active.max_new:
            # every allowed token was sent before the move (the last one's chunk carried the
            # flushed text too); only the end was lost
            with self._lock:
                self._outbox.append(self._finish_unstarted(active))
            return PrefillProgressChunk(task_id=req.task_id, processed=0, total=prompt_ids)
        if self.max_batch > 1:
            self._reuse_prefix(active, ids)
        with self._lock:
            active.cancel_requested = self._accepting_cancelled
            if self.max_batch > 1:
                self._prefilling = active
            else:
                self._active = active
        # the prompt tokens the prompt cache provided count as processed (``reused``)
        return PrefillProgressChunk(task_id=req.task_id, processed=min(active.reused, prompt_ids), total=prompt_ids)

    def _vocab_size(self) -> int:
        """Rows of the model's output (the ids a logit bias may name)."""
        args = getattr(self.loaded.model, "args", None)
        size = getattr(args, "vocab_size", None)
        return int(size) if size else len(self.loaded.tokenizer.get_vocab())

    def _sample(self, active: _Active, tokens: mx.array) -> mx.array:
        """Lazy next token [1] after feeding ``tokens`` [L] (as mlx-lm's ``_step``)."""
        assert self.stage is not None
        return self.stage.next_token(self.loaded.model, tokens[None], active.cache, active.sampler)

    def _prefill_step(self, active: _Active, limit: int | None = None) -> list[Chunk]:
        """Prefill one chunk of at most ``prefill_chunk_size`` (and ``limit``) prompt tokens;
        the prompt's last token is fed with the first token's sampling (``next_token``)."""
        total = int(active.prompt.size)  # resumed tokens included: they are prefilled too
        out: list[Chunk] = []
        with mx.stream(generation_stream):
            if total - active.processed > 1:
                n = min(self.prefill_chunk_size, limit or self.prefill_chunk_size, total - active.processed - 1)
                chunk = active.prompt[active.processed : active.processed + n]
                assert self.stage is not None
                self.stage.prefill(self.loaded.model, chunk[None], active.cache)
                active.processed += n
                self.prefilled_tokens += n
                out.append(PrefillProgressChunk(task_id=active.request.task_id,
                                                processed=active.processed, total=total))
                mx.clear_cache()
            if total - active.processed == 1:
                self.prefilled_tokens += 1
                active.next_token = self._sample(active, active.prompt[total - 1 :])
                mx.async_eval(active.next_token)
                active.processed = total
        return out

    def _decode_step(self, active: _Active) -> list[Chunk]:
        y = active.next_token
        assert y is not None
        if active.completion_tokens + 1 < active.max_new:
            with mx.stream(generation_stream):
                next_y = self._sample(active, y)
            mx.async_eval(next_y)
        else:
            next_y = None
        token = y.item()
        out, done = self._consume(active, token, self.clock())
        if not done:
            active.next_token = next_y
        return out

    def _consume(self, active: _Active, token: int, now: float) -> tuple[list[Chunk], bool]:
        """The chunks for ``active``'s sampled ``token`` (read at ``now``) and whether the
        sequence ended with it (its ``FinishChunk`` is then among the chunks)."""
        req = active.request
        if self.on_token is not None:
            self.on_token(req.task_id, token)
        out: list[Chunk] = []
        if active.t_first is None:
            active.t_first = now
            total = active.prompt_tokens
            out.append(PrefillProgressChunk(task_id=req.task_id, processed=total, total=total))
        if token in self._eos:
            if text := self._final_text(active):
                out.append(TokenChunk(task_id=req.task_id, text=text,
                                      completion_tokens=active.completion_tokens))
            out.append(self._finish(active, "stop"))
            return out, True
        active.t_last = now
        active.completion_tokens += 1
        active.detokenizer.add_token(token)
        text, stopped = active.stops.feed(active.detokenizer.last_segment)
        at_limit = not stopped and active.completion_tokens >= active.max_new
        if at_limit:
            text += self._final_text(active)
            stopped = active.stops.stopped
        out.append(TokenChunk(task_id=req.task_id, text=text,
                              completion_tokens=active.completion_tokens, token_id=int(token)))
        if stopped or at_limit:
            out.append(self._finish(active, "stop" if stopped else "length"))
            return out, True
        if active.completion_tokens % 256 == 1:
            mx.clear_cache()
        return out, False

    def _final_text(self, active: _Active) -> str:
        """Flush the detokenizer and the stop matcher when generation ends: the text held
        back so far, cut before a stop string should the flushed text complete one."""
        active.detokenizer.finalize()
        text, stopped = active.stops.feed(active.detokenizer.last_segment)
        return text if stopped else text + active.stops.flush()

    def _finish(self, active: _Active, reason: FinishReason) -> FinishChunk:
        n = active.completion_tokens
        t_first, t_last = active.t_first, active.t_last
        ttft = 0.0 if t_first is None else t_first - active.submitted_at
        tps = 0.0
        new = n - active.resumed  # tokens decoded by this task
        if new > 1 and t_first is not None and t_last is not None and t_last > t_first:
            tps = (new - 1) / (t_last - t_first)
        self._end()
        return FinishChunk(task_id=active.request.task_id, finish_reason=reason,
                           prompt_tokens=active.prompt_tokens, completion_tokens=n,
                           ttft=ttft, decode_tokens_per_second=tps,
                           stop_sequence=active.stops.matched if reason == "stop" else None)

    def _finish_unstarted(self, active: _Active) -> FinishChunk:
        """The ``FinishChunk`` of a resumed request that needs no more tokens ("length")."""
        return FinishChunk(task_id=active.request.task_id, finish_reason="length",
                           prompt_tokens=active.prompt_tokens, completion_tokens=active.completion_tokens)

    def _end(self) -> None:
        with self._lock:
            self._active = None

    # -- the batch (max_batch > 1) ---------------------------------------------------------

    def _batch_step(self) -> list[Chunk]:
        """One step of the batch, in this order (the same on every rank, since every rank
        holds the same requests in the same order and the same tokens):

        1. sequences cancelled since the last step leave (their ``FinishChunk``);
        2. prefill, within a budget of ``prefill_chunk_size`` prompt tokens this step: while
           the batch has room, the next queued request is accepted (when its KV fits, see
           ``_admit``) and prefilled (its own KV cache, batch size 1); a sequence whose
           prefill ends joins the batch at once (its cache merged in as a new left-padded
           row) and the next one may follow in the same step; a prompt longer than what is
           left of the budget goes on next step;
        3. one decode step of the batch: every row is fed its last token in one forward
           pass, each row's token is read and consumed, and rows that ended leave at once
           (their KV rows dropped).
        """
        with self._lock:
            out, self._outbox = self._outbox, []
        gone = [i for i, row in enumerate(self._rows) if row.cancel_requested]
        for i in gone:
            out.append(self._finish(self._rows[i], "cancelled"))
        self._drop_rows(gone)
        budget = self.prefill_chunk_size
        while budget > 0:
            if self._prefilling is None:
                with self._lock:
                    queued = self._queue.popleft() if self._queue and self._room() else None
                    if queued is None:
                        break
                    self._accepting, self._accepting_cancelled = queued.request.task_id, False
                try:
                    out.extend(self._admit(queued))
                except Exception as e:
                    out.append(_error(queued.request.task_id, 500, f"generation failed: {e!r}"))
                finally:
                    with self._lock:
                        self._accepting = None
                        waiting = bool(self._queue) and self._queue[0] is queued
                if waiting:
                    break
                continue  # started (prefilling now) or ended at once
            pre = self._prefilling
            if pre.cancel_requested:
                out.append(self._finish(pre, "cancelled"))
                self._set_prefilling(None)
                continue
            if pre.next_token is not None:
                break
            before = pre.processed
            try:
                out.extend(self._prefill_step(pre, budget))
            except Exception as e:
                self._set_prefilling(None)
                out.append(_error(pre.request.task_id, 500, f"generation failed: {e!r}"))
                continue
            budget -= pre.processed - before
            if pre.next_token is None:
                break  # the rest of its prompt next step
            self._join()
        if self._rows or (self._prefilling is not None and self._prefilling.next_token is not None):
            try:
                out.extend(self._batch_decode())
            except Exception as e:  # the batch's forward failed: every row ends failed
                for row in self._rows:
                    out.append(_error(row.request.task_id, 500, f"generation failed: {e!r}"))
                self._drop_rows(list(range(len(self._rows))))
        return out

    def _admit(self, queued: _Queued) -> list[Chunk]:
        """Accept ``queued`` into the batch when its KV fits (``_verdict``): it starts
        prefilling; when it does not fit yet it goes back to the head of the queue (checked
        again once rows leave); when it can never fit it ends with the 503."""
        if queued.prepared is None:
            prepared = self._prepare(queued)
            if not isinstance(prepared, _Active):
                return [prepared]
            queued.prepared = prepared
        active = queued.prepared
        verdict = self._verdict(active)
        if verdict == "never":
            return [self._out_of_memory(active)]
        if verdict == "wait":
            with self._lock:
                if self._accepting_cancelled:
                    return [FinishChunk(task_id=active.request.task_id, finish_reason="cancelled",
                                        prompt_tokens=0, completion_tokens=0)]
                self._queue.appendleft(queued)
            return []
        return [self._start(active)]

    def _set_prefilling(self, active: _Active | None) -> None:
        with self._lock:
            self._prefilling = active

    def _join(self) -> None:
        """The prefilled sequence becomes the batch's last row (its KV cache merged in)."""
        from mlx_lm.models.cache import BatchKVCache

        pre = self._prefilling
        assert pre is not None and pre.next_token is not None
        rows = [BatchKVCache.merge([c]) for c in pre.cache]
        if self._batch_cache is None:
            self._batch_cache, self._batch_y = rows, pre.next_token.reshape(-1)
        else:
            assert self._batch_y is not None
            for batch, row in zip(self._batch_cache, rows, strict=True):
                batch.extend(row)
            self._batch_y = mx.concatenate([self._batch_y, pre.next_token.reshape(-1)])
        pre.cache = []  # the batch holds its KV now
        with self._lock:
            self._rows.append(pre)
            self._prefilling = None

    def _drop_rows(self, indices: list[int]) -> None:
        """Rows ``indices`` leave the batch and free their KV."""
        if not indices:
            return
        keep = [i for i in range(len(self._rows)) if i not in set(indices)]
        with self._lock:
            self._rows = [self._rows[i] for i in keep]
        if not keep:
            self._batch_cache, self._batch_y = None, None
            mx.clear_cache()
            return
        assert self._batch_cache is not None and self._batch_y is not None
        index = mx.array(keep, dtype=mx.int32)
        for c in self._batch_cache:
            c.filter(index)
        self._batch_y = self._batch_y[index]

    def _batch_decode(self) -> list[Chunk]:
        if self._prefilling is not None and self._prefilling.next_token is not None:
            self._join()
        assert self._batch_cache is not None and self._batch_y is not None and self.stage is not None
        y = self._batch_y
        with mx.stream(generation_stream):
            next_y = self.stage.next_tokens(self.loaded.model, y[:, None], self._batch_cache,
                                            [row.sampler for row in self._rows])
        mx.async_eval(next_y)
        tokens = y.tolist()
        now = self.clock()
        out: list[Chunk] = []
        ended = []
        for i, (row, token) in enumerate(zip(self._rows, tokens, strict=True)):
            row.fed.append(int(token))  # this step's forward fed it into the KV
            chunks, done = self._consume(row, int(token), now)
            out.extend(chunks)
            if done:
                ended.append(i)
                self._keep_prefix(i, row)
        self._batch_y = next_y
        self._drop_rows(ended)
        return out

    # -- the prompt cache (batch path) ----------------------------------------------------------

    @property
    def _caching(self) -> bool:
        if self.max_batch < 2 or self.prompt_cache_bytes <= 0:
            return False
        return isinstance(self.stage, LocalStage) or self.reuse_gather is not None

    def _over_cache_bound(self, extra_tokens: int = 0, extra_bytes: int = 0) -> bool:
        """Whether the prompt cache (plus an entry of ``extra_*``) exceeds its bound: tokens
        (``prompt_cache_tokens``, the same on every rank) when set, else bytes."""
        if self.prompt_cache_tokens is not None:
            return sum(len(p.tokens) for p in self._prefixes.values()) + extra_tokens > self.prompt_cache_tokens
        return self.prompt_cache_nbytes + extra_bytes > self.prompt_cache_bytes

    @property
    def prompt_cache_nbytes(self) -> int:
        """Bytes of KV the prompt cache holds now."""
        return sum(p.nbytes for p in self._prefixes.values())

    def _keep_prefix(self, index: int, row: _Active) -> None:
        """Keep row ``index``'s KV (prompt + fed tokens) in the LRU prompt cache, evicting the
        least recently used entries beyond ``prompt_cache_bytes``."""
        if not self._caching or self._batch_cache is None:
            return
        cache = [c.extract(index) for c in self._batch_cache]
        tokens = [int(t) for t in row.prompt.tolist()] + row.fed
        if cache and cache[0].offset != len(tokens):
            return  # not the tokens we think it holds: never reuse it
        nbytes = sum(c.nbytes for c in cache)
        self._prefix_keys += 1
        if self._over_cache_bound(len(tokens), nbytes) and not self._prefixes:
            return  # larger than the whole cache
        mx.eval([c.state for c in cache])
        self._prefixes[self._prefix_keys] = _CachedPrefix(tokens, cache, nbytes)
        while self._over_cache_bound():
            self._prefixes.popitem(last=False)

    def _reuse_prefix(self, active: _Active, ids: Sequence[int]) -> None:
        """Start ``active`` from the cached entry sharing the longest prefix with its prompt
        ``ids`` (at most all but the last prompt token: that one yields the first token).
        On a multi-rank instance a collective (every rank accepts at the same step)."""
        if not self._caching:
            return
        best_key, best = None, 0
        for key, entry in self._prefixes.items():
            n = 0
            for a, b in zip(entry.tokens, ids):
                if a != b:
                    break
                n += 1
            if n > best:
                best_key, best = key, n
        best = min(best, len(ids) - 1) if best_key is not None else 0
        if self.reuse_gather is not None:
            # rank 0 decides the reused length; a rank holding less (it should not: the
            # bound is in tokens, so every rank keeps the same entries) lowers it for all
            proposals = self.reuse_gather(np.array([best], dtype=np.int64)).reshape(-1)
            best = int(proposals.min())  # rank 0's length, or less
        if best_key is None or best < 1:
            return
        self._prefixes.move_to_end(best_key)
        from mlx_lm.models.cache import KVCache

        cache = []
        for c in self._prefixes[best_key].cache:
            copy = KVCache()
            copy.keys, copy.values = c.keys[..., :best, :], c.values[..., :best, :]
            copy.offset = best
            cache.append(copy)
        active.cache, active.processed, active.reused = cache, best, best
