"""A replayed agent session on an in-process engine: a long system prompt, then turns that
each append the previous answer and a new user message (what a coding agent resends), with
each turn's greedy answer and time to first token."""

from __future__ import annotations

import time
from dataclasses import dataclass

from exo_p2p.types.chunks import ErrorChunk, FinishChunk, TokenChunk
from exo_p2p.types.tasks import ChatMessage, GenerationParams
from worker.engine.scheduler import Engine

MAX_STEPS = 20_000
PAIR_TOKENS = 10.2
"""Prompt tokens per "toolN argM" pair of ``system_prompt`` with the synthetic model's
tokenizer (measured: 1,760 tokens for 172 pairs)."""


def system_prompt(tokens: int) -> str:
    """A system prompt of about ``tokens`` tokens (tool descriptions' stand-in)."""
    return "You are a coding agent. Tools: " + " ".join(f"tool{i % 89} arg{i % 13}" for i in range(int(tokens / PAIR_TOKENS)))


@dataclass
class Turn:
    """One served turn: its answer's text and token ids, prompt tokens, time to first token (s)."""

    text: str
    ids: list[int]
    prompt_tokens: int
    ttft: float


def serve(engine: Engine, task_id: str, messages: list[ChatMessage], max_tokens: int = 12) -> Turn:
    """Serve one greedy turn of ``messages`` on ``engine`` (idle before and after)."""
    ids: list[int] = []
    engine.on_token = lambda _t, tok: ids.append(tok)
    start = time.perf_counter()
    engine.submit(task_id, GenerationParams(messages=tuple(messages), max_tokens=max_tokens, temperature=0.0))
    text, first, end = "", None, None
    for _ in range(MAX_STEPS):
        if not engine.has_work():
            break
        for chunk in engine.step():
            if isinstance(chunk, TokenChunk):
                first = first if first is not None else time.perf_counter() - start
                text += chunk.text
            elif isinstance(chunk, FinishChunk):
                end = chunk
            elif isinstance(chunk, ErrorChunk):
                raise AssertionError(chunk.error.message)
    assert end is not None and first is not None, "the turn did not finish"
    return Turn(text, ids, end.prompt_tokens, first)


def session_messages(system: str, turn: int, answers: list[str]) -> list[ChatMessage]:
    """Turn ``turn``'s (0-based) messages given the earlier turns' ``answers``."""
    out = [ChatMessage("system", system)]
    for i in range(turn + 1):
        out.append(ChatMessage("user", f"step {i}: run the tests and fix what fails in module_{i}.py"))
        if i < turn:
            out.append(ChatMessage("assistant", answers[i]))
    return out


def replay(engine: Engine, system: str, turns: range, answers: list[str]) -> list[Turn]:
    """Serve ``turns`` of the session on ``engine``, appending each answer to ``answers``."""
    served = []
    for t in turns:
        turn = serve(engine, f"turn{t}", session_messages(system, t, answers))
        answers.append(turn.text)
        served.append(turn)
    return served
