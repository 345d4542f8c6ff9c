"""The decode batch: the sequences decoding together, one forward pass per step.

A prefilled sequence joins as the batch's last row: its own KV cache is merged in as a new
row of mlx-lm's left-padded ``BatchKVCache`` (the padding is masked, each row keeps its own
RoPE offset); sequences prefilled together (``prefill.PrefillGroup``) join as the last rows,
their batch cache appended as it is. Each ``decode`` feeds every row its last token in one forward pass ``[B, 1]``
and draws row ``i`` with its own ``Sampler``; rows that end leave at once (``drop``: their KV
rows are freed), the others keep their order. Every rank of a multi-rank instance holds the
same rows in the same order: joins and drops only follow agreed requests, cancels and the
shared tokens.

Decode pipelines like ``mlx_lm.generate.generate_step``: the next step's tokens are built and
``mx.async_eval``-ed before this step's are read, so the model runs while Python
detokenizes and matches stop strings; when every row ends with this step's token (each is at
its last allowed token) no next step is built.

Rows with an output format (``constraint``) need their next token's mask, which depends on
this step's token, before the next step's draw: when the batch holds such a row, a step is
split in two (``Stage.forward_last``, then ``Stage.sample``): the next forward pass is
queued first, the masks are computed while it runs, then its draw is queued. A batch without
such rows takes the one-call path and pays nothing.

Choice (not measured against per-sequence caches): left-padding, since one batched attention
call per layer keeps the decode step one forward pass; the padding costs at most the length
difference between the longest and the shortest row. A batch of one row is the same path.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from worker.engine.batch_memory import RowKV
from worker.engine.forward import generation_stream
from worker.engine.pipeline import Stage
from worker.engine.sequence import Sequence


class DecodeBatch:
    """The rows decoding together (``rows``, in order) and their merged KV.

    ``max_rows`` (≥ 1) bounds ``rows``; ``join`` beyond it raises ``ValueError``.
    """

    def __init__(self, max_rows: int) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, not {max_rows}")
        self.max_rows = max_rows
        self.rows: list[Sequence] = []
        self._cache: list[Any] | None = None  # one BatchKVCache per local layer
        self._next: mx.array | None = None  # [B] the tokens each row is fed next (lazy)
        self.spec: Any = None  # a spec.verify.SpecDecoder when speculative decoding is on

    @property
    def full(self) -> bool:
        return len(self.rows) >= self.max_rows

    @property
    def holds_kv(self) -> bool:
        """Whether any KV is held (False once the last row has left)."""
        return self._cache is not None

    def kv_rows(self) -> list[RowKV]:
        """Each row's KV now and still to come (``batch_memory``)."""
        return [row.kv() for row in self.rows]

    def join(self, seq: Sequence) -> None:
        """``seq`` (prefilled) becomes the last row; the batch takes over its KV cache."""
        from worker.engine.kvq.layers import merge_rows

        if seq.next_token is None:
            raise ValueError(f"sequence {seq.task_id} has not finished its prefill")
        self.join_group([seq], [merge_rows([c]) for c in seq.cache], seq.next_token.reshape(-1))

    def join_group(self, seqs: list[Sequence], cache: list[Any], first: mx.array) -> None:
        """``seqs`` (prefilled together) become the last rows, in order: ``cache`` is their
        batch KV (one left-padded ``BatchKVCache`` per local layer, a row per sequence) and
        ``first`` ``[len(seqs)]`` their first tokens (lazy). Raises ``ValueError`` beyond
        ``max_rows``."""
        if len(self.rows) + len(seqs) > self.max_rows:
            raise ValueError(f"the batch holds {len(self.rows)} rows already (at most {self.max_rows})")
        if self._cache is None:
            self._cache, self._next = cache, first
        else:
            assert self._next is not None
            for batch, rows in zip(self._cache, cache, strict=True):
                batch.extend(rows)
            self._next = mx.concatenate([self._next, first])
        for seq in seqs:
            seq.cache = []
        self.rows.extend(seqs)

    def decode(self, stage: Stage, model: Any) -> list[int | list[int]]:
        """One decode step: each row's token (``len(rows)`` ints, row order; with ``spec``, a
        row may take several: the list of its tokens, ``engine/spec/verify.py``). This step's
        forward pass feeds them into the KV (appended to each row's ``fed``) and computes the
        next step's tokens in the background — unless every row ends with this token (each at
        its last allowed one): then nothing is fed. Constrained rows' grammars advance by
        their token and their next masks are set between the forward and the draw."""
        if self.spec is not None and (runs := self.spec.step(self, stage, model)) is not None:
            return runs
        if any(row.constraint is not None for row in self.rows):
            return self.sample_step(stage, self.forward_step(stage, model))
        assert self._cache is not None and self._next is not None
        tokens_in = self._next
        if not self._feeds:
            self._next = None  # every row ends with this token: it is never fed
            return [int(t) for t in tokens_in.tolist()]
        with mx.stream(generation_stream):
            self._next = stage.next_tokens(model, tokens_in[:, None], self._cache, [row.sampler for row in self.rows])
        mx.async_eval(self._next)
        return self._fed([int(t) for t in tokens_in.tolist()])

    @property
    def cache(self) -> list[Any] | None:
        """The batch's KV (one ``BatchKVCache`` per local layer; None: no rows)."""
        return self._cache

    @property
    def next_tokens(self) -> mx.array | None:
        """``[B]`` the token each row is fed next (lazy; None: no rows)."""
        return self._next

    def set_next(self, tokens: mx.array, fed: list[int | list[int]]) -> None:
        """After a step fed by the caller (``spec``): ``fed[i]`` (a token or a list of them)
        are now in row ``i``'s KV, ``tokens [B]`` are fed next."""
        for row, run in zip(self.rows, fed, strict=True):
            row.fed.extend(run) if isinstance(run, list) else row.fed.append(run)
        self._next = tokens

    @property
    def feeds(self) -> bool:
        """Whether this step feeds its tokens (some row goes on after it)."""
        return self._feeds

    @property
    def _feeds(self) -> bool:
        """Whether this step feeds its tokens (some row goes on after it)."""
        return any(row.completion_tokens + 1 < row.max_new for row in self.rows)

    def _fed(self, tokens: list[int]) -> list[int]:
        for row, token in zip(self.rows, tokens, strict=True):
            row.fed.append(token)
        return tokens

    def forward_step(self, stage: Stage, model: Any) -> mx.array | None:
        """The first half of ``decode`` (``micro.MicroBatches`` queues every micro-batch's
        before any draw): this rank's part of the forward pass that feeds each row its token,
        queued (``Stage.forward_last``); None when nothing is fed (every row ends with this
        token). Give its result to ``sample_step`` before the next step."""
        assert self._cache is not None and self._next is not None
        if not self._feeds:
            return None
        with mx.stream(generation_stream):
            pending = stage.forward_last(model, self._next[:, None], self._cache)
        mx.async_eval(pending)
        return pending

    def sample_step(self, stage: Stage, pending: mx.array | None) -> list[int]:
        """The second half of ``decode``: constrained rows' grammars advanced and their masks
        set, the next tokens' draw queued (``Stage.sample``); returns this step's tokens, as
        ``decode``."""
        assert self._next is not None
        tokens_in = self._next
        if pending is None:
            self._next = None  # every row ends with this token: it is never fed
            return [int(t) for t in tokens_in.tolist()]
        tokens: list[int] = []
        with mx.stream(generation_stream):
            if any(row.constraint is not None for row in self.rows):
                tokens = [int(t) for t in tokens_in.tolist()]
                self._mask(stage, tokens)
            self._next = stage.sample(pending, [row.sampler for row in self.rows])
        mx.async_eval(self._next)
        return self._fed(tokens or [int(t) for t in tokens_in.tolist()])

    def advance_masks(self, stage: Stage, tokens: list[int]) -> None:
        """``_mask`` for a step fed by the caller (``spec``)."""
        self._mask(stage, tokens)

    def _mask(self, stage: Stage, tokens: list[int]) -> None:
        """Advance each constrained row's grammar by its ``tokens`` entry and, on the rank
        that samples, set its sampler's mask for the next draw (every active row's computed
        together; None inside a think block)."""
        rows = [row for row in self.rows if row.constraint is not None]
        for row, token in zip(self.rows, tokens, strict=True):
            if row.constraint is not None:
                row.constraint.advance(token)
        if not stage.samples:
            return
        active = [row for row in rows if row.constraint.active and row.constraint.error is None]  # type: ignore[union-attr]
        for row in rows:
            row.sampler.mask = None
        if active:
            masks = active[0].constraint.grammars.masks([row.constraint for row in active])  # type: ignore[union-attr]
            for i, row in enumerate(active):
                row.sampler.mask = masks[i : i + 1]

    def extract(self, index: int) -> list[Any]:
        """Row ``index``'s KV as one plain ``KVCache`` per layer (padding removed)."""
        assert self._cache is not None
        return [c.extract(index) for c in self._cache]

    def drop(self, indices: list[int]) -> list[Sequence]:
        """Rows ``indices`` leave and free their KV; returns them."""
        if not indices:
            return []
        gone = set(indices)
        left = [self.rows[i] for i in indices]
        keep = [i for i in range(len(self.rows)) if i not in gone]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self._cache, self._next = None, None
            mx.clear_cache()
            return left
        assert self._cache is not None
        index = mx.array(keep, dtype=mx.int32)
        for c in self._cache:
            c.filter(index)
        if self._next is not None:
            self._next = self._next[index]
        return left
