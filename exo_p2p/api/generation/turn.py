"""An answer as the shared generation path hands it to a family: text, reasoning and tool calls.

The runner splits a model's output into a ``TokenChunk``'s ``text`` (the content),
``reasoning`` (a thinking model's think block) and ``calls`` (tool calls it completed, never in
the text). ``generation.py`` keeps the answer so far in a ``Turn`` and asks the family's
encoder for the bytes of each token (``token_bytes``) and of a whole non-streamed answer
(``answer_bytes``). An encoder that serves tools and reasoning implements ``TurnEncoder``'s
methods besides ``StreamEncoder``'s; one that does not gets the text alone (its reasoning and
calls are dropped: such a family never sends tools).
"""

from __future__ import annotations

from typing import Any, Protocol

from exo_p2p.types import FinishChunk, TokenChunk, ToolCall
from exo_p2p.types.chunks import TokenLogprobs


class Turn:
    """The answer so far: ``texts``, ``reasonings`` (pieces as they came), ``calls`` and
    ``reasoning_tokens`` (tokens whose text was reasoning), ``logprobs`` (each generated
    token's, when the request asked for them) and ``offset`` (characters of text and
    reasoning so far: where the next token's text starts)."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.reasonings: list[str] = []
        self.calls: list[ToolCall] = []
        self.reasoning_tokens = 0
        self.logprobs: list[TokenLogprobs] = []
        self.offset = 0

    def add(self, chunk: TokenChunk) -> None:
        """Take one token's pieces."""
        if chunk.logprobs is not None:
            self.logprobs.append(chunk.logprobs)
        self.offset += len(chunk.text) + len(chunk.reasoning)
        if chunk.text:
            self.texts.append(chunk.text)
        if chunk.reasoning:
            self.reasonings.append(chunk.reasoning)
            self.reasoning_tokens += chunk.token_id is not None
        self.calls.extend(chunk.calls)

    @property
    def text(self) -> str:
        return "".join(self.texts)

    @property
    def reasoning(self) -> str:
        return "".join(self.reasonings)


class TurnEncoder(Protocol):
    """What a family's encoder adds to ``StreamEncoder`` to serve tools and reasoning.

    ``reasoning(delta)``: the stream event of reasoning text; ``calls(calls, first)``: the
    stream events of whole tool calls, ``first`` the index of the first of them in the answer;
    ``answer(turn, chunk)``: a whole non-streamed answer (JSON) with text, reasoning and calls.
    """

    def reasoning(self, delta: str) -> bytes: ...

    def calls(self, calls: tuple[ToolCall, ...], first: int) -> bytes: ...

    def answer(self, turn: Turn, chunk: FinishChunk) -> bytes: ...


def token_bytes(encoder: Any, chunk: TokenChunk, turn: Turn) -> bytes:
    """The stream bytes of one token (reasoning, then text, then calls) and ``turn`` updated;
    empty bytes when the token carries nothing to send. A token with log-probabilities goes
    to the encoder's ``text_with_logprobs(text, logprobs, offset)`` when it has one (an event
    even for a token whose text is empty or reasoning: every generated token has its entry)."""
    out = b""
    if chunk.reasoning and hasattr(encoder, "reasoning"):
        out += encoder.reasoning(chunk.reasoning)
    if chunk.logprobs is not None and hasattr(encoder, "text_with_logprobs"):
        out += encoder.text_with_logprobs(chunk.text, chunk.logprobs, turn.offset)
    elif chunk.text:
        out += encoder.text(chunk.text)
    if chunk.calls and hasattr(encoder, "calls"):
        out += encoder.calls(chunk.calls, len(turn.calls))
    turn.add(chunk)
    return out


def finish_bytes(encoder: Any, chunk: FinishChunk, turn: Turn) -> bytes:
    """A stream's closing bytes: the encoder's ``finish_turn`` (whose usage counts the turn's
    reasoning tokens) when it has one, else its ``finish``."""
    if hasattr(encoder, "finish_turn"):
        return encoder.finish_turn(chunk, turn)
    return encoder.finish(chunk)


def answer_bytes(encoder: Any, turn: Turn, chunk: FinishChunk) -> bytes:
    """A whole non-streamed answer: the encoder's ``answer`` when it has one, else its
    ``body`` of the text alone."""
    if hasattr(encoder, "answer"):
        return encoder.answer(turn, chunk)
    return encoder.body(turn.text, chunk)
