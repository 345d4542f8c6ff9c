"""Constrained decoding: a grammar matcher per row, and the token masks of a batch.

A request with an ``OutputFormat`` (``exo_p2p.content.output_format``) gets a ``RowConstraint``: an
llguidance ``LLMatcher`` over the model's tokenizer. Before each sampling step of its row the
sampler sets every logit outside the matcher's allowed tokens to −∞ (``Sampler.mask``); the
sampled token advances the matcher. When the format is complete the matcher allows only the
end-of-turn tokens, so the row ends with ``stop`` the way any row does, on every rank at the
same step (the ranks share each sampled token).

Ranks: every rank builds and advances the matcher (building is deterministic: the same
grammar, tokenizer and fuel limits give the same verdict everywhere, so a request refused on
one rank is refused on all); only the rank that samples (``Stage.samples``) computes masks,
the costly part. ``Grammars.masks`` computes the masks of a batch's constrained rows
together (llguidance's thread pool, the GIL released) into one bitmask, and unpacks it with
plain mlx operations into ``[rows, vocab]`` booleans (llguidance's own MLX kernel is
Metal-only).

Reasoning: for a model whose tokenizer has think markers, the constraint starts after the
reasoning: while a row is inside a think block (its prompt ends inside one, or it opened one
as its first token) nothing is masked or fed to the matcher; the think-end token starts the
constraint. A row that has not yet started may open a think block (its first mask also
allows the think-start token).

The llguidance tokenizer is built once per runner (about 1 s for a 50k vocabulary), in a
background thread started with the engine, so the first constrained request seldom waits.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from exo_p2p.content.output_format import FormatError, grammar_of, guarded, matcher_limits
from exo_p2p.types.tasks import OutputFormat


class ConstraintError(RuntimeError):
    """A row's matcher entered its error state (a token outside its mask was fed): the row
    fails, the others go on."""


class RowConstraint:
    """One row's grammar state (see the module docstring). ``matcher``: an ``LLMatcher``;
    ``grammars``: the runner's ``Grammars`` (its masks); ``thinking``: whether the row starts
    inside a think block."""

    def __init__(self, matcher: Any, grammars: Grammars, thinking: bool = False) -> None:
        self.matcher = matcher
        self.grammars = grammars
        self.think = grammars.think
        self.thinking = thinking
        self.started = False
        """Whether a token was fed to the matcher (a think block may open before that)."""
        self.error: str | None = None

    @property
    def active(self) -> bool:
        """Whether the next token is masked (not inside a think block)."""
        return not self.thinking

    def advance(self, token: int) -> None:
        """Feed sampled ``token``: enter or leave a think block, or advance the matcher. A
        token the matcher refuses sets ``error`` (raised by ``check``)."""
        if self.think is not None:
            start, end = self.think
            if self.thinking:
                self.thinking = token != end
                return
            if not self.started and token == start:
                self.thinking = True
                return
        self.started = True
        if self.error is None and not self.matcher.consume_token(int(token)):
            self.error = self.matcher.get_error() or f"token {token} is outside the format"

    def replay(self, tokens: Sequence[int]) -> None:
        """Feed already-sent ``tokens`` (a resumed request), as ``advance`` does one."""
        for token in tokens:
            self.advance(int(token))

    def check(self) -> None:
        """Raise ``ConstraintError`` when the matcher is in its error state."""
        if self.error is not None:
            raise ConstraintError(f"structured output failed: {self.error}")

    def mask(self) -> mx.array | None:
        """This row's allowed tokens ``[1, vocab]`` bool for its next draw, None inside a
        think block."""
        return self.grammars.masks([self])[0:1] if self.active else None

    @property
    def complete(self) -> bool:
        """Whether the format is complete and nothing more may follow (only end-of-turn)."""
        return self.started and bool(self.matcher.is_stopped())


class Grammars:
    """One runner's grammar machinery: the llguidance tokenizer (built in the background from
    ``tokenizer``, mlx-lm's ``TokenizerWrapper``), a thread pool for masks, and ``vocab``
    (the width of the model's logits, ≥ the tokenizer's size: ids beyond the tokenizer are
    never allowed). ``eos``: the end-of-turn ids the complete format allows; ``think``: the
    think markers' ids or None."""

    def __init__(self, tokenizer: Any, vocab: int, eos: Sequence[int], think: tuple[int, int] | None = None) -> None:
        self.vocab = int(vocab)
        self.eos = sorted(int(e) for e in eos)
        self.think = think
        self._hf = getattr(tokenizer, "_tokenizer", tokenizer)
        self._ready = threading.Event()
        self._llg: Any = None
        self._failure: str | None = None
        self._executor: Any = None
        self.mask_calls = 0
        """Batches of masks computed (tests and benchmarks read it)."""
        threading.Thread(target=self._build, name="grammar-tokenizer", daemon=True).start()

    def _build(self) -> None:
        try:
            import llguidance
            import llguidance.hf

            size = max(self.vocab, len(self._hf))
            self._llg = llguidance.hf.from_tokenizer(self._hf, n_vocab=size, eos_token=self.eos)
            self._executor = llguidance.LLExecutor(num_threads=2)
        except Exception as e:  # noqa: BLE001 - every constrained request gets this reason
            self._failure = f"structured output is not available for this model's tokenizer: {e}"
        finally:
            self._ready.set()

    def tokenizer(self, timeout: float = 60.0) -> Any:
        """The llguidance tokenizer (waits for its build). Raises ``FormatError`` when it
        could not be built."""
        if not self._ready.wait(timeout):
            raise FormatError("the grammar tokenizer is still being built; try again")
        if self._llg is None:
            raise FormatError(self._failure or "structured output is not available")
        return self._llg

    def constraint(self, fmt: OutputFormat, prompt: Sequence[int]) -> RowConstraint:
        """A new row's constraint for ``fmt`` after ``prompt`` (token ids: whether it ends
        inside a think block). Raises ``FormatError`` with llguidance's message when the
        format cannot be built (bounded by ``exo_p2p.content.output_format``'s limits)."""
        import llguidance

        grammar = guarded(grammar_of, fmt)
        matcher = guarded(llguidance.LLMatcher, self.tokenizer(), grammar, log_level=0, limits=matcher_limits())
        if matcher.is_error():
            raise FormatError(" ".join(matcher.get_error().split())[:600])
        matcher.compute_bitmask()  # a format no output matches (a $ref cycle, an empty class) fails at its first mask
        if matcher.is_error():
            reason = " ".join(matcher.get_error().split())[:300]
            raise FormatError(f"no output can match the format ({reason or 'it allows no text'})")
        return RowConstraint(matcher, self, thinking=inside_think(prompt, self.think))

    def masks(self, rows: Sequence[RowConstraint]) -> mx.array:
        """The allowed tokens of each of ``rows`` (all active): ``[len(rows), vocab]`` bool,
        computed together. A row that has not started and may still think also allows the
        think-start token."""
        self.tokenizer()  # built, or FormatError
        import llguidance.numpy as llg_np

        words = (self.vocab + 31) // 32
        self.mask_calls += 1
        bits = np.zeros((len(rows), words), dtype=np.int32)
        llg_np.fill_next_token_bitmask_par(self._executor, [(r.matcher, i) for i, r in enumerate(rows)], bits)
        mask = unpack_bits(mx.array(bits), self.vocab)
        opens = [i for i, r in enumerate(rows) if r.think is not None and not r.started]
        if opens and self.think is not None:
            allow = mx.zeros((len(rows), self.vocab), dtype=mx.bool_)
            allow[mx.array(opens), self.think[0]] = True
            mask = mask | allow
        return mask


def inside_think(prompt: Sequence[int], think: tuple[int, int] | None) -> bool:
    """Whether ``prompt`` (token ids) ends inside a think block: its last think marker is
    the start one (``think``: start and end ids; None: never)."""
    if think is None:
        return False
    for token in reversed(list(prompt)):
        if token in think:
            return token == think[0]
    return False


def unpack_bits(bits: mx.array, vocab: int) -> mx.array:
    """``[rows, words]`` int32 bitmasks (bit ``j`` of word ``w`` = token ``32 w + j``) as
    ``[rows, vocab]`` bool. The shifts are made here, on the calling thread's stream: an
    array made at import would belong to the importing thread's stream (a runner imports
    the engine on its preload thread), which the engine's thread cannot evaluate."""
    rows = bits.shape[0]
    flags = mx.right_shift(bits[:, :, None], mx.arange(32, dtype=mx.int32)) & 1
    return flags.reshape(rows, -1)[:, :vocab].astype(mx.bool_)
