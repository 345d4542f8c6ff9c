"""Prefill of several prompts in one forward pass: the ``PrefillGroup``.

Sequences accepted in the same step are prefilled together, as mlx-lm's ``BatchGenerator``
prefills up to ``prefill_batch_size`` prompts at once: on a CPU a forward pass of ``K``
prompts costs far less than ``K`` passes of one (the weights are read once, the matmuls are
larger), and the decode batch is full sooner. The rows' KV caches (empty, or a prefix reused
from the prompt cache) are merged into one left-padded batch cache (mlx-lm's
``BatchKVCache``); each chunk feeds every row up to ``limit`` more of its prompt in one forward
``[K, n]``: a row with fewer tokens left is right-padded, and the padding is rolled to the left
after the pass (``BatchKVCache.prepare``/``finalize``), so every row's chunks are the ones it
would be fed alone and the padding stays masked. Once only each row's last prompt token is
left, one forward ``[K, 1]`` feeds them all with the first token's sampling (row ``i`` drawn
by its own sampler), and the group joins the decode batch as it is (``DecodeBatch.join_group``).

A group of one prefills through ``Sequence.prefill_chunk``, the path of a request alone.

A request accepted while a group prefills joins it between two chunks (``add``: its KV, empty
or a cached prefix, merged into the group's) instead of waiting for the whole group, and
rows whose prompts end first do not wait for the others: once a chunk leaves some rows at
their last prompt token while others still have more to feed, ``split_ready`` takes those
rows out (their KV extracted from the merged cache), samples their first tokens in one
forward ``[R, 1]`` and hands them to the decode batch; the rest go on prefilling. So a
request whose prompt the prompt cache mostly holds (a conversation's next turn) gets its
first token a step or two after it was accepted, not after the longest prompt of its group
(docs/architecture.md#engine).

The group's size: at most ``PREFILL_GROUP_TOKENS ÷ prefill_chunk_size`` rows (one chunk of
the group feeds at most that many tokens, so its activations stay those of the generous
chunk bound the master assumes, ``master.admission.PREFILL_CHUNK_BOUND``), and what the decode
batch has room for.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import mlx.core as mx

from exo_p2p.types.chunks import Chunk, ErrorChunk, PrefillProgressChunk
from worker.engine.batch_memory import model_head_dim, peak_batch_tokens
from worker.engine.forward import generation_stream, new_cache
from worker.engine.kvq.layers import merge_rows, quantized, quantized_filled
from worker.engine.pipeline import Stage
from worker.engine.prepare import error_chunk
from worker.engine.cache.identity import tenant_of
from worker.engine.prompt_cache import PromptCache
from worker.engine.sequence import Sequence

PREFILL_GROUP_TOKENS = 256
"""Prompt tokens one chunk of a group feeds at most (rows × ``prefill_chunk_size``)."""


def group_limit(prefill_chunk_size: int, room: int) -> int:
    """Rows a group may take: ``PREFILL_GROUP_TOKENS ÷ prefill_chunk_size`` (tokens), at
    most ``room`` (rows the decode batch can still take), at least one when there is room."""
    return max(0, min(room, max(1, PREFILL_GROUP_TOKENS // prefill_chunk_size)))


class KvPreset(NamedTuple):
    """A request's prompt made elsewhere (a vision row: ``worker.vision.engine``): ``ids`` its
    token ids, and ``cache`` (None: none) the KV of its first ``length`` tokens, fed as its
    prefill's first part, of which ``reused`` came from the prompt cache (reported as cached)."""

    ids: list[int]
    cache: list[Any] | None = None
    length: int = 0
    reused: int = 0


def start_kv(seq: Sequence, prompt_cache: PromptCache, model: Any, bits: int = 0, preset: KvPreset | None = None) -> None:
    """Give ``seq``, just accepted, its KV: ``preset``'s when it has one, else the prompt
    cache's longest prefix of its prompt (a collective on a multi-rank instance, see
    ``PromptCache.reuse``), else an empty cache; quantized to ``bits`` (0: full precision;
    ``kvq.layers.quantized``, ``kvq.layers.quantized_filled`` for a preset made in full precision)."""
    if preset is not None and preset.cache is not None:
        cache = quantized_filled(preset.cache, bits, model_head_dim(model) if bits else 0)
        seq.cache, seq.processed, seq.reused = cache, preset.length, preset.reused
        return
    cache, reused = prompt_cache.reuse(seq.tokens(), tenant_of(seq.params))
    if reused:
        seq.cache, seq.processed, seq.reused = cache, reused, reused
    else:
        seq.cache = quantized(new_cache(model), bits, model_head_dim(model) if bits else 0)


def out_of_memory(seq: Sequence, capacity: int | None, model_id: str) -> ErrorChunk:
    """The 503 of ``seq``, whose KV cannot fit in ``capacity`` tokens even alone."""
    need = peak_batch_tokens([seq.kv()])
    return error_chunk(seq.task_id, 503,
                       f"out of memory: the prompt ({seq.prompt_tokens} tokens) and its token budget "
                       f"({seq.max_new} tokens: max_tokens or the context) need up to {need} tokens of KV cache, "
                       f"but the runners of model {model_id} can hold {capacity} tokens; "
                       "shorten the prompt or lower max_tokens", param="messages", code="out_of_memory")


class PrefillGroup:
    """Sequences being prefilled together (``rows``, in acceptance order; see the module
    docstring). ``prefill_chunk`` feeds one chunk; once ``prefilled``, ``join`` hands the
    rows and their KV to the decode batch."""

    def __init__(self, rows: list[Sequence]) -> None:
        if not rows:
            raise ValueError("a prefill group needs at least one sequence")
        self.rows = list(rows)
        self.solo = len(rows) == 1  # the path of a request alone, for good
        self._cache: list[Any] | None = None  # the merged batch cache (one per local layer)
        self._first: mx.array | None = None  # [K] first tokens (lazy) once prefilled

    @property
    def task_ids(self) -> list[str]:
        return [s.task_id for s in self.rows]

    @property
    def prefilled(self) -> bool:
        """Whether every row's prompt is in the KV and its first token is sampled."""
        return all(s.prefilled for s in self.rows)

    def add(self, seqs: list[Sequence]) -> None:
        """``seqs``, just accepted (their KV empty or a cached prefix), join the group between
        two chunks: their KV merged into the group's, left-padded (``BatchKVCache.extend``),
        so a request arriving while a long prompt prefills starts with the next chunk, not
        after the whole prompt (module docstring). Raises ``ValueError`` for no ``seqs``."""
        if not seqs:
            raise ValueError("no sequence to add")
        if self._cache is not None:
            with mx.stream(generation_stream):
                for batch, layer in zip(self._cache, zip(*(s.cache for s in seqs)), strict=True):
                    batch.extend(merge_rows(list(layer)))
            for s in seqs:
                s.cache = []
        self.solo = False  # merged at the next chunk when not yet (a lone row's own KV included)
        self.rows.extend(seqs)

    def discard(self, seq: Sequence) -> bool:
        """``seq`` leaves the group when in it (cancelled or failed; its KV rows freed);
        returns whether the group is empty now."""
        i = next((j for j, s in enumerate(self.rows) if s is seq), None)
        if i is not None:
            self.rows.pop(i)
            if self._cache is not None and self.rows:
                keep = mx.array([j for j in range(len(self.rows) + 1) if j != i], dtype=mx.int32)
                for c in self._cache:
                    c.filter(keep)
        if not self.rows:
            self._cache = None
        return not self.rows

    def take_out(self, seq: Sequence) -> bool:
        """``seq`` (a row of this group not yet at its last prompt token) leaves the group
        with its KV so far as its own cache (extracted from the merged one), to rejoin a group
        later by ``add`` and go on from where it was (``fair_share``: paused); returns whether
        the group is empty now. Raises ``ValueError`` when ``seq`` is not a row here."""
        if not any(s is seq for s in self.rows):
            raise ValueError(f"{seq.task_id} is not a row of this group")
        if self._cache is not None:
            i = next(j for j, s in enumerate(self.rows) if s is seq)
            with mx.stream(generation_stream):
                seq.cache = [c.extract(i) for c in self._cache]
        return self.discard(seq)

    def prefill_chunk(self, stage: Stage, model: Any, limit: int) -> list[Chunk]:
        """Feed every row at most ``limit`` (≥ 1) more prompt tokens in one forward pass,
        then, when only the last token of each row is left, feed those with the first
        token's sampling (a call may feed ``limit + 1`` tokens a row). Returns the progress
        chunks of the rows fed."""
        if self.solo:
            return self.rows[0].prefill_chunk(stage, model, limit)
        out: list[Chunk] = []
        with mx.stream(generation_stream):
            if self._cache is None:
                self._cache = [merge_rows(list(layer)) for layer in zip(*(s.cache for s in self.rows))]
                for s in self.rows:
                    s.cache = []
            left = [int(s.prompt.size) - s.processed - 1 for s in self.rows]
            if (n := min(limit, max(left))) > 0:
                out += self._feed(stage, model, [min(n, k) for k in left], n)
            if all(int(s.prompt.size) - s.processed == 1 for s in self.rows):
                last = mx.concatenate([s.prompt[-1:] for s in self.rows])[:, None]
                for s in self.rows:
                    s.first_mask(stage)
                self._first = stage.next_tokens(model, last, self._cache, [s.sampler for s in self.rows])
                mx.async_eval(self._first)
                for i, s in enumerate(self.rows):
                    s.processed = int(s.prompt.size)
                    s.next_token = self._first[i : i + 1]
        return out

    def split_ready(self, stage: Stage, model: Any) -> PrefillGroup | None:
        """The rows at their last prompt token while other rows have more to prefill, as a
        group of their own with their first tokens sampled (one forward ``[R, 1]``), taken
        out of this one (module docstring); None when there are none or every row is there
        (the group ends as a whole). If the forward raises, this group is left as it was."""
        if self.solo or self._cache is None:
            return None
        done = [i for i, s in enumerate(self.rows) if int(s.prompt.size) - s.processed == 1]
        if not done or len(done) == len(self.rows):
            return None
        with mx.stream(generation_stream):
            for i in done:
                self.rows[i].cache = [c.extract(i) for c in self._cache]
        ready = PrefillGroup([self.rows[i] for i in done])
        ready.prefill_chunk(stage, model, 1)  # nothing left to feed but the last tokens: their first tokens
        keep = [i for i in range(len(self.rows)) if i not in done]
        for c in self._cache:
            c.filter(mx.array(keep, dtype=mx.int32))
        self.rows = [self.rows[i] for i in keep]
        return ready

    def _feed(self, stage: Stage, model: Any, fed: list[int], n: int) -> list[Chunk]:
        """One forward ``[K, n]``: row ``i`` fed its next ``fed[i]`` prompt tokens,
        right-padded to ``n``; the padding then rolled left (masked from then on)."""
        assert self._cache is not None
        pad = [n - f for f in fed]
        tokens = mx.stack([mx.concatenate([s.prompt[s.processed : s.processed + f], mx.zeros((p,), s.prompt.dtype)])
                           if p else s.prompt[s.processed : s.processed + f] for s, f, p in zip(self.rows, fed, pad)])
        if any(pad):
            for c in self._cache:
                c.prepare(right_padding=pad)
        stage.prefill(model, tokens, self._cache)
        if any(pad):
            for c in self._cache:
                c.finalize()
        out: list[Chunk] = []
        for s, f in zip(self.rows, fed):
            if f:
                s.processed += f
                out.append(PrefillProgressChunk(task_id=s.task_id, processed=s.processed, total=int(s.prompt.size)))
        mx.clear_cache()
        return out

    def join(self, batch: Any) -> None:
        """Hand the prefilled rows and their KV to ``batch`` (a ``DecodeBatch``), in order."""
        if self.solo:
            batch.join(self.rows[0])
            return
        assert self._cache is not None and self._first is not None
        batch.join_group(self.rows, self._cache, self._first)
        self._cache, self._first = None, None
