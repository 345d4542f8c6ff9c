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

Unlike mlx-lm, whose sampler draws from the process-global ``mx.random`` state, each
``Sampler`` owns its own key (``mx.random.key(seed)``, split once per draw), so one seed
always gives the same tokens whatever else the process samples, and pipeline ranks that share
the seed draw the same token.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors


def seed_for(task_id: str, seed: int | None) -> int:
    """The request's seed, or one derived from its task id (sha256, 63 bits) when the
    client gave none: random across requests, but the same on every rank of an instance."""
    if seed is not None:
        return int(seed) & ((1 << 63) - 1)
    return int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:8], "little") >> 1


class Sampler:
    """Draws one token id per call from log-probabilities ``[batch, vocab]`` → ``[batch]``.

    ``prompt`` (token ids) seeds the history the penalties look at; every drawn token is
    appended to it. Calls are lazy (they only build the graph), so the generator can
    ``mx.async_eval`` the next token while the current one is detokenized. Not thread-safe:
    one per request. Raises ``ValueError`` for a negative temperature or penalty context.
    """

    def __init__(
        self,
        temperature: float,
        top_p: float,
        seed: int,
        *,
        top_k: int = 0,
        min_p: float = 0.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repetition_penalty: float = 1.0,
        penalty_context: int = 64,
        logit_bias: Sequence[tuple[int, float]] = (),
        prompt: Sequence[int] | mx.array = (),
    ) -> None:
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, not {temperature}")
        if penalty_context < 1:
            raise ValueError(f"penalty_context must be >= 1, not {penalty_context}")
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.top_k = int(top_k)
        self.min_p = float(min_p)
        self._key = mx.random.key(seed) if self.temperature > 0 else None
        self._processors = make_logits_processors(
            logit_bias=dict(logit_bias) or None,
            repetition_penalty=None if repetition_penalty == 1.0 else float(repetition_penalty),
            repetition_context_size=penalty_context,
            presence_penalty=float(presence_penalty) or None,
            presence_context_size=penalty_context,
            frequency_penalty=float(frequency_penalty) or None,
            frequency_context_size=penalty_context,
        )
        self._context = penalty_context
        self._history: mx.array | None = None
        if self._processors:
            ids = prompt if isinstance(prompt, mx.array) else mx.array(list(prompt), dtype=mx.int32)
            self._history = ids.astype(mx.int32)[-penalty_context:]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def __call__(self, logprobs: mx.array) -> mx.array:
        if self._processors:
            assert self._history is not None
            for process in self._processors:
                logprobs = process(self._history, logprobs)
            logprobs = logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)
        token = self._draw(logprobs)
        if self._processors:
            assert self._history is not None
            self._history = mx.concatenate([self._history, token.reshape(-1).astype(mx.int32)])[-self._context :]
        return token

    def _draw(self, logprobs: mx.array) -> mx.array:
        if self._key is None:
            return mx.argmax(logprobs, axis=-1)
        if 0 < self.top_p < 1.0:
            logprobs = apply_top_p(logprobs, self.top_p)
        if self.min_p > 0.0:
            logprobs = apply_min_p(logprobs, self.min_p)
        if 0 < self.top_k < logprobs.shape[-1]:
            logprobs = apply_top_k(logprobs, self.top_k)
        self._key, sub = mx.random.split(self._key)
        return mx.random.categorical(logprobs * (1.0 / self.temperature), key=sub)
