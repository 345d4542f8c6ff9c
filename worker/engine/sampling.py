"""Token sampling with a per-request random key.

Semantics follow ``mlx_lm.sample_utils.make_sampler``: temperature 0 is greedy argmax over
the log-probabilities; otherwise top-p (nucleus, via mlx-lm's ``apply_top_p``) when
``0 < top_p < 1``, then a categorical draw from ``logprobs / temperature``. Unlike mlx-lm,
whose sampler draws from the process-global ``mx.random`` state, each ``Sampler`` owns its
own key (``mx.random.key(seed)``, split once per draw), so one seed always gives the same
tokens whatever else the process samples, and pipeline ranks that share the seed draw the
same token.
"""

from __future__ import annotations

import hashlib

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_p


def seed_for(task_id: str, seed: int | None) -> int:
    """The request's seed, or one derived from its task id (sha256, 63 bits) when the
    client gave none: random across requests, but the same on every rank of an instance."""
    if seed is not None:
        return int(seed) & ((1 << 63) - 1)
    return int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:8], "little") >> 1


class Sampler:
    """Draws one token id per call from log-probabilities ``[batch, vocab]`` → ``[batch]``.

    Calls are lazy (they only build the graph), so the generator can ``mx.async_eval`` the
    next token while the current one is detokenized. Not thread-safe: one per request.
    """

    def __init__(self, temperature: float, top_p: float, seed: int) -> None:
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, not {temperature}")
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self._key = mx.random.key(seed) if self.temperature > 0 else None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def __call__(self, logprobs: mx.array) -> mx.array:
        if self._key is None:
            return mx.argmax(logprobs, axis=-1)
        if 0 < self.top_p < 1.0:
            logprobs = apply_top_p(logprobs, self.top_p)
        self._key, sub = mx.random.split(self._key)
        return mx.random.categorical(logprobs * (1.0 / self.temperature), key=sub)
