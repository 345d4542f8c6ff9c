"""Stages: how one rank turns prompt tokens into the next token.

The engine drives a ``Stage`` (``prefill`` one chunk, ``next_token``, ``next_tokens`` of a batch); a single-rank
instance uses ``LocalStage`` (the whole model, as before), a pipeline rank a
``PipelineStage``:

- rank 0 embeds the tokens, runs its layers ``[start, end)`` and sends the hidden states
  ``[1, L, hidden]`` to rank 1 (``mx.distributed.send``);
- rank r > 0 receives them from r − 1 (``recv_like``), runs its layers and sends them on;
- the last rank applies the final norm and the head, and samples;
- every rank then ends the step with the same token: the last rank's token is summed over the
  group (``all_sum`` of ``[token]`` on the last rank and ``[0]`` elsewhere), so all ranks stop
  at the same step on end-of-turn, stop strings and max_tokens. Only the last rank samples, so
  the request's seed (``sampling.seed_for``) fully decides the draw.

A rank waiting for another's turn sleeps (``engine.ring_wait``): a rank > 0 until its input
hidden states arrive, a rank < W − 1 until the last ranks' tokens do.

Each rank keeps the KV cache of its own layers only. The send is a dependency of what the
rank evaluates (``mx.depends``), so evaluating a step's token runs this rank's part of it.
Every pipeline op runs on the engine's stream, in the same order on every rank.

A rank's layers run inside the family's own forward (``engine.layer_span``: embedding scale,
masks per kind of layer, norm, tied or untied head), so every mlx-lm family whose layers pass
only hidden states to each other pipelines (``model.model.embed_tokens / layers / norm``); the
families that cannot are refused at placement (``exo_p2p.models.card.families``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import mlx.core as mx
import mlx.nn as nn

from worker.engine.forward import Forward, forward
from worker.engine.layer_span import LayerSpan, span_of
from worker.engine.ring_wait import NO_WAIT, RingWait, all_sum_length
from worker.engine.sampling import Sampler
from worker.engine.token_logprobs import pack, unpack, width

_DTYPES = (mx.float32, mx.float16, mx.bfloat16)


class Stage(Protocol):
    """One rank's part of a generation step (all calls in the same order on every rank)."""

    def prefill(self, model: nn.Module, tokens: mx.array, cache: list[Any]) -> None:
        """Feed ``tokens [B, L]`` into the KV cache and evaluate (blocks); B > 1: the
        prompts of a prefill group, ``cache`` a batch cache."""
        ...

    def next_token(self, model: nn.Module, tokens: mx.array, cache: list[Any], sampler: Sampler) -> mx.array:
        """Feed ``tokens [1, L]`` and return the lazy next token ``[1]`` (int)."""
        ...

    def next_tokens(self, model: nn.Module, tokens: mx.array, cache: list[Any],
                    samplers: Sequence[Sampler]) -> mx.array:
        """Feed ``tokens [B, L]`` (one row per sequence of a batch, ``cache`` a batch cache)
        and return the lazy next tokens ``[B]`` (int), row ``i`` drawn by ``samplers[i]``."""
        ...

    samples: bool
    """Whether this rank draws the tokens (the one whose samplers' masks matter)."""

    def forward_last(self, model: nn.Module, tokens: mx.array, cache: list[Any]) -> mx.array:
        """The first half of ``next_tokens``: feed ``tokens [B, L]`` and return what
        ``sample`` draws from (lazy: the last position's log-probabilities ``[B, vocab]`` on
        the rank that samples, this rank's part of the step elsewhere). The engine evaluates
        it in the background while it computes the rows' token masks."""
        ...

    def sample(self, pending: mx.array, samplers: Sequence[Sampler]) -> mx.array:
        """The second half of ``next_tokens``: the lazy tokens ``[B]`` drawn from
        ``forward_last``'s result, the same on every rank."""
        ...


class StageFailed(RuntimeError):
    """A forward pass of a multi-rank stage failed (a collective failed, e.g. its ring
    link was reset, or only this rank raised): the ranks can no longer be assumed in step,
    and a ring whose socket failed never works again, so the runner fails, not the request
    (docs/architecture.md#engine)."""


def request_error(stage: object, exc: Exception) -> Exception:
    """``exc``, raised by a forward pass of ``stage``, as the failing request's error: as it
    is on a single-rank stage (``LocalStage``: that request fails, the others go on).
    Raises ``StageFailed`` from it on any other stage."""
    if isinstance(stage, LocalStage):
        return exc
    raise StageFailed(f"{type(exc).__name__}: {exc}") from exc


def sample_rows(samplers: Sequence[Sampler], logprobs: mx.array) -> mx.array:
    """Row ``i`` of ``logprobs [B, vocab]`` drawn by ``samplers[i]`` → ``[B]`` (lazy): every
    sequence of a batch keeps its own sampling parameters, key and penalty history."""
    if len(samplers) != logprobs.shape[0]:
        raise ValueError(f"{len(samplers)} samplers for {logprobs.shape[0]} rows")
    if len(samplers) == 1:
        return samplers[0](logprobs)
    plain = [s.plain_greedy for s in samplers]
    if all(plain):  # one argmax for the whole batch instead of one op per row
        return mx.argmax(logprobs, axis=-1)
    if not any(plain):
        return mx.concatenate([s(logprobs[i : i + 1]).reshape(-1) for i, s in enumerate(samplers)])
    tokens = mx.argmax(logprobs, axis=-1)  # the plain greedy rows; the others replaced below
    rows = mx.arange(len(samplers))
    for i, s in enumerate(samplers):
        if not plain[i]:
            tokens = mx.where(rows == i, s(logprobs[i : i + 1]).reshape(-1).astype(tokens.dtype), tokens)
    return tokens


def logprobs_of(logits: mx.array) -> mx.array:
    """Log-probabilities of the last position, each row normalized on its own:
    ``[B, L, vocab] -> [B, vocab]`` (top-p and min-p read them as probabilities)."""
    last = logits[:, -1, :]
    return last - mx.logsumexp(last, axis=-1, keepdims=True)


class LocalStage:
    """The whole model on one rank, through ``forward`` (the single-rank path)."""

    samples = True

    def __init__(self, forward_fn: Forward = forward) -> None:
        self.forward = forward_fn

    def prefill(self, model: nn.Module, tokens: mx.array, cache: list[Any]) -> None:
        self.forward(model, tokens, cache)
        mx.eval([c.state for c in cache])

    def next_token(self, model: nn.Module, tokens: mx.array, cache: list[Any], sampler: Sampler) -> mx.array:
        return sampler(logprobs_of(self.forward(model, tokens, cache)))

    def next_tokens(self, model: nn.Module, tokens: mx.array, cache: list[Any],
                    samplers: Sequence[Sampler]) -> mx.array:
        return sample_rows(samplers, logprobs_of(self.forward(model, tokens, cache)))

    def forward_last(self, model: nn.Module, tokens: mx.array, cache: list[Any]) -> mx.array:
        return logprobs_of(self.forward(model, tokens, cache))

    def sample(self, pending: mx.array, samplers: Sequence[Sampler]) -> mx.array:
        return sample_rows(samplers, pending)


def _span(model: nn.Module) -> LayerSpan:
    span = span_of(model)
    if span is None:
        raise ValueError(f"{type(model).__module__} model holds every layer: load a layer range to pipeline it")
    return span


class PipelineStage:
    """Rank ``rank`` of a ``world_size``-rank pipeline over ``group`` (see module doc).

    Construct it on every rank at the same point (``hidden_dtype`` may be found with
    ``probe_hidden_dtype``, a collective). ``hidden_size`` is the model's hidden size.
    ``wire_dtype``: every rank casts the hidden states it sends to this dtype (then every
    rank's ``hidden_dtype`` is it too): one dtype between ranks whose weights differ (a
    float32 rank next to a stored float16 one). None: send what the layers computed.
    ``wait``: how this rank waits for its neighbours' turns (``ring_wait.pipeline_wait``;
    NO_WAIT: in MLX's receive, spinning).
    """

    def __init__(self, group: mx.distributed.Group, hidden_size: int, hidden_dtype: mx.Dtype,
                 wire_dtype: mx.Dtype | None = None, wait: RingWait = NO_WAIT) -> None:
        self.group = group
        self.wait = wait
        self._summed: mx.array | None = None  # the last all-sum of tokens posted (ranks < W - 1)
        self.wire_dtype = wire_dtype
        self.rank = group.rank()
        self.world_size = group.size()
        self.hidden_size = hidden_size
        self.hidden_dtype = hidden_dtype
        self.is_first = self.rank == 0
        self.is_last = self.rank == self.world_size - 1
        self.samples = self.is_last

    def prefill_embedded(self, model: nn.Module, tokens: mx.array, cache: list[Any], embeds: mx.array | None) -> None:
        """``prefill`` with the first rank's input embeddings given (``embeds``: a vision row's,
        ``worker.vision.ranks``; None on the other ranks) instead of the tokens' own."""
        h = self._hidden(model, tokens, cache, embeds)
        mx.eval([] if self.is_last else h, [c.state for c in cache])

    def _hidden(self, model: nn.Module, tokens: mx.array, cache: list[Any], first: mx.array | None = None) -> mx.array:
        """This rank's output: the hidden states it sends on, or the logits (last rank)."""
        received = None
        if not self.is_first:
            self.wait.from_left()  # asleep until rank - 1's hidden states come (engine.ring_wait)
            like = mx.zeros((tokens.shape[0], tokens.shape[1], self.hidden_size), dtype=self.hidden_dtype)
            received = mx.distributed.recv_like(like, self.rank - 1, group=self.group)
        h = _span(model).run(tokens, cache, received, first)
        if not self.is_last:
            if self.wire_dtype is not None:
                h = h.astype(self.wire_dtype)
            h = mx.distributed.send(h, self.rank + 1, group=self.group)
        return h

    def every_position(self, model: nn.Module, tokens: mx.array, cache: list[Any]) -> mx.array:
        """This rank's part of feeding ``tokens [B, L]`` (lazy): the logits of every position
        ``[B, L, vocab]`` on the last rank, else the hidden states sent on (``engine/spec``)."""
        return self._hidden(model, tokens, cache)

    def prefill(self, model: nn.Module, tokens: mx.array, cache: list[Any]) -> None:
        h = self._hidden(model, tokens, cache)  # the last rank's logits are not needed here
        mx.eval([] if self.is_last else h, [c.state for c in cache])

    def next_token(self, model: nn.Module, tokens: mx.array, cache: list[Any], sampler: Sampler) -> mx.array:
        return self.next_tokens(model, tokens, cache, [sampler])

    def next_tokens(self, model: nn.Module, tokens: mx.array, cache: list[Any],
                    samplers: Sequence[Sampler]) -> mx.array:
        return self.sample(self.forward_last(model, tokens, cache), samplers)

    def forward_last(self, model: nn.Module, tokens: mx.array, cache: list[Any]) -> mx.array:
        h = self._hidden(model, tokens, cache)
        return logprobs_of(h) if self.is_last else h

    def sample(self, pending: mx.array, samplers: Sequence[Sampler]) -> mx.array:
        if any(s.top_logprobs is not None for s in samplers):
            return self._sample_with_logprobs(pending, samplers)
        rows = pending.shape[0]
        padding = all_sum_length(rows, self.world_size) - rows  # every ring segment holds bytes
        if self.is_last:
            token = sample_rows(samplers, pending).astype(mx.int32)
            if padding:
                token = mx.concatenate([token, mx.zeros((padding,), dtype=mx.int32)])
            return mx.distributed.all_sum(token, group=self.group)[:rows]
        if self.wait.active:  # this rank's part done, asleep until the later ranks' tokens come
            mx.eval(pending, *([] if self._summed is None else [self._summed]))
            self.wait.from_either()
        token = mx.depends(mx.zeros((rows + padding,), dtype=mx.int32), pending)
        self._summed = mx.distributed.all_sum(token, group=self.group)
        return self._summed[:rows]


    def _sample_with_logprobs(self, pending: mx.array, samplers: Sequence[Sampler]) -> mx.array:
        """``sample`` when some row asked for logprobs: the last rank's tokens and their
        records (``token_logprobs.pack``) in one float32 all-sum; every other rank appends
        the records it receives to its samplers' ``pending``, as the last rank's draws did."""
        rows = pending.shape[0]
        ks = [s.top_logprobs for s in samplers]
        size = rows * width(max((k for k in ks if k is not None), default=0))
        padding = all_sum_length(size, self.world_size) - size
        if self.is_last:
            tokens = sample_rows(samplers, pending).astype(mx.int32)
            records = [s.pending[-1] if s.top_logprobs is not None else None for s in samplers]
            flat = pack(tokens, records, max(k for k in ks if k is not None)).reshape(-1)
        else:
            if self.wait.active:
                mx.eval(pending, *([] if self._summed is None else [self._summed]))
                self.wait.from_either()
            flat = mx.depends(mx.zeros((size,), dtype=mx.float32), pending)
        if padding:
            flat = mx.concatenate([flat, mx.zeros((padding,), dtype=mx.float32)])
        summed = mx.distributed.all_sum(flat, group=self.group)
        tokens, records = unpack(summed, rows, ks)
        if not self.is_last:
            self._summed = summed
            for sampler, rec in zip(samplers, records, strict=True):
                if rec is not None:
                    sampler.pending.append(rec)
        return tokens


def probe_hidden_dtype(model: nn.Module, group: mx.distributed.Group, hidden_size: int) -> mx.Dtype:
    """The dtype of the hidden states each rank receives, found once (a collective: call on
    every rank at the same point). Rank 0 reads it from its embedding and layers' lazy graph
    (nothing is computed), sends the dtype's code to rank 1, which does the same with its
    layers, and so on; the returned dtype is what this rank *receives* (rank 0: what it
    sends)."""
    rank, size = group.rank(), group.size()
    span = _span(model)
    tokens = mx.zeros((1, 1), dtype=mx.int32)
    if rank == 0:
        in_dtype = model.model.embed_tokens(tokens).dtype
    else:
        code = mx.distributed.recv(shape=(1,), dtype=mx.int32, src=rank - 1, group=group)
        in_dtype = _DTYPES[int(code.item())]
    if rank < size - 1:
        received = None if rank == 0 else mx.zeros((1, 1, hidden_size), dtype=in_dtype)
        out_dtype = span.run(tokens, span.new_cache(), received).dtype
        mx.eval(mx.distributed.send(mx.array([_DTYPES.index(out_dtype)], dtype=mx.int32), rank + 1, group=group))
    return in_dtype
