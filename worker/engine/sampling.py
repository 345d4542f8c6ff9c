"""Token sampling with a per-request random key.

Semantics follow ``mlx_lm.sample_utils`` (``make_logits_processors`` then ``make_sampler``):

1. logits processors from ``make_logits_processors`` — ``logit_bias``, ``repetition_penalty``,
   ``presence_penalty``, ``frequency_penalty``, each over the last ``penalty_context`` tokens
   (prompt included, as mlx-lm's ``generate_step``) — applied to the log-probabilities, then
   renormalized. Bias and the additive penalties shift logits, so this is the same as on
   logits; the multiplicative repetition penalty always lowers a repeated token's score here
   (a log-probability is never positive), where on raw logits its sign decides;
2. temperature 0 is greedy argmax (after step 1, so a banned token is never chosen);
3. otherwise ``apply_top_p`` (when ``0 < top_p < 1``), ``apply_min_p`` (``min_p > 0``),
   ``apply_top_k`` (``0 < top_k < vocab``), in mlx-lm's order, then a categorical draw from
   ``logprobs / temperature``.

Unlike mlx-lm, whose sampler draws from the process-global ``mx.random`` state, each draw's
key is derived from (seed, position) alone (``step_key_seed``: the position of the drawn token in
the whole sequence, prompt included), never from a running state. So one seed always gives
the same tokens whatever else the process samples, pipeline ranks that share the seed draw
the same token, and a request resumed elsewhere with prompt + the tokens already generated
as its new prompt draws the same next tokens as the uninterrupted run (``exo_p2p.api.generation.resume``).
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Sequence

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors

from exo_p2p.types.tasks import GenerationParams
from worker.engine.token_logprobs import record


def seed_for(task_id: str, seed: int | None) -> int:
    """The request's seed, or one derived from its task id (sha256, 63 bits) when the
    client gave none: random across requests, but the same on every rank of an instance."""
    if seed is not None:
        return int(seed) & ((1 << 63) - 1)
    return int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:8], "little") >> 1


_MASK64 = (1 << 64) - 1


def step_key_seed(seed: int, position: int) -> int:
    """The 63-bit key seed of the draw at sequence ``position`` (tokens, ≥ 0) for ``seed``:
    splitmix64 of ``seed`` and ``position``, so neighbouring positions get unrelated keys."""
    z = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    for _ in range(2):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z ^= z >> 31
    return z >> 1


class Sampler:
    """Draws one token id per call from log-probabilities ``[batch, vocab]`` → ``[batch]``.

    The sampling fields of ``params`` (``GenerationParams``: temperature, top_p, top_k,
    min_p, the penalties and their context, logit_bias) decide the draw; ``seed`` (see
    ``seed_for``) its keys.
    ``prompt`` (token ids) seeds the history the penalties look at; every drawn token is
    appended to it. ``position`` is the sequence position of the first drawn token (default
    ``len(prompt)``); each draw's key is ``step_key_seed(seed, position)``. Calls are lazy
    (they only build the graph), so the engine can
    ``mx.async_eval`` the next token while the current one is detokenized.

    A constrained request (``constrained``: it has an output format) has ``mask``, set by the
    engine before each draw: ``[1, vocab]`` bool, the tokens its grammar allows; every other
    log-probability is −∞ before anything else (``worker/engine/answer/constraint.py``), then the
    row is renormalized. ``mask`` None draws unmasked (a row inside a think block). Not thread-safe:
    one per request. Raises ``ValueError`` for a negative temperature or penalty context.

    ``top_logprobs`` (None: off; from ``params.logprobs``, the engine may clamp it to the
    vocabulary): each draw appends its lazy record (``token_logprobs.record``, of the
    log-probabilities the call was given) to ``pending``, which the sequence reads in draw
    order (at most ``PENDING_MAX`` kept). ``forced`` maps a draw index (0: this sampler's
    first draw; ``draws`` counts them) to the token that draw returns whatever the
    distribution (a forced end of reasoning, ``think_budget``).
    """

    PENDING_MAX = 8
    """Draws whose records wait to be read: the engine reads each within two steps."""

    def __init__(self, params: GenerationParams, seed: int, *, prompt: Sequence[int] | mx.array = (),
                 position: int | None = None) -> None:
        if params.temperature < 0:
            raise ValueError(f"temperature must be >= 0, not {params.temperature}")
        if params.penalty_context < 1:
            raise ValueError(f"penalty_context must be >= 1, not {params.penalty_context}")
        self.temperature = float(params.temperature)
        self.top_p = float(params.top_p)
        self.top_k = int(params.top_k)
        self.min_p = float(params.min_p)
        self._seed = int(seed)
        self._position = int(prompt.size if isinstance(prompt, mx.array) else len(prompt)) if position is None else int(position)
        penalty_context = params.penalty_context
        self._processors = make_logits_processors(
            logit_bias=dict(params.logit_bias) or None,
            repetition_penalty=None if params.repetition_penalty == 1.0 else float(params.repetition_penalty),
            repetition_context_size=penalty_context,
            presence_penalty=float(params.presence_penalty) or None,
            presence_context_size=penalty_context,
            frequency_penalty=float(params.frequency_penalty) or None,
            frequency_context_size=penalty_context,
        )
        self._context = penalty_context
        self.top_logprobs: int | None = params.logprobs
        self.pending: deque[mx.array] = deque(maxlen=self.PENDING_MAX)
        self.forced: dict[int, int] = {}
        self.draws = 0
        self.constrained = params.output_format is not None
        self.mask: mx.array | None = None
        self._history: mx.array | None = None
        if self._processors:
            ids = prompt if isinstance(prompt, mx.array) else mx.array(list(prompt), dtype=mx.int32)
            self._history = ids.astype(mx.int32)[-penalty_context:]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def plain_greedy(self) -> bool:
        """Greedy with no logits processors: the draw is ``argmax`` of the row alone and
        keeps no state, so a batch may draw all such rows with one ``argmax``."""
        return (self.temperature == 0 and not self._processors and not self.constrained
                and self.top_logprobs is None and not self.forced)

    @property
    def plain_sampled(self) -> bool:
        """Sampled with no logits processors, mask, logprobs or forced tokens: each draw is
        a categorical draw from ``distribution(logprobs)`` alone (speculative rows verify
        drafts against it: ``engine/spec/rejection.py``)."""
        return (self.temperature != 0 and not self._processors and not self.constrained
                and self.top_logprobs is None and not self.forced)

    def key_seeds(self, count: int) -> list[int]:
        """The key seeds of the next ``count`` draws (``step_key_seed``), not used up."""
        return [step_key_seed(self._seed, self._position + j) for j in range(count)]

    def skip(self, count: int) -> None:
        """``count`` draws were made elsewhere with ``key_seeds(count)`` (used up)."""
        self._position += count
        self.draws += count

    def __call__(self, logprobs: mx.array) -> mx.array:
        raw = logprobs
        forced = self.forced.pop(self.draws, None)
        self.draws += 1
        if forced is not None:
            token = mx.array([forced], dtype=mx.uint32)
            if self.temperature != 0:
                self._position += 1  # the draw's key position is used up as a drawn one's
        else:
            token = self._sample(logprobs)
        if self._processors:
            assert self._history is not None
            self._history = mx.concatenate([self._history, token.reshape(-1).astype(mx.int32)])[-self._context :]
        if self.top_logprobs is not None:
            self.pending.append(record(raw, token, self.top_logprobs))
        return token

    def _sample(self, logprobs: mx.array) -> mx.array:
        if self.mask is not None:
            logprobs = mx.where(self.mask, logprobs, -mx.inf)
            if not self._processors and self.temperature != 0:
                logprobs = logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)
        if self._processors:
            assert self._history is not None
            for process in self._processors:
                logprobs = process(self._history, logprobs)
            logprobs = logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)
        return self._draw(logprobs)

    def _draw(self, logprobs: mx.array) -> mx.array:
        if self.temperature == 0:
            return mx.argmax(logprobs, axis=-1)
        key = mx.random.key(step_key_seed(self._seed, self._position))
        self._position += 1
        return mx.random.categorical(self.distribution(logprobs), key=key)

    def distribution(self, logprobs: mx.array) -> mx.array:
        """What a sampled draw is categorical over (unnormalized log-probabilities, ``[N,
        vocab]`` like ``logprobs``): top-p, min-p, top-k, then the temperature."""
        if 0 < self.top_p < 1.0:
            logprobs = apply_top_p(logprobs, self.top_p)
        if self.min_p > 0.0:
            logprobs = apply_min_p(logprobs, self.min_p)
        if 0 < self.top_k < logprobs.shape[-1]:
            logprobs = apply_top_k(logprobs, self.top_k)
        return logprobs * (1.0 / self.temperature)
