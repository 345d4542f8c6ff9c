"""Driving a batch of requests through a runner and collecting their chunks."""

from __future__ import annotations

from typing import Any

from exo_p2p.types.chunks import ErrorChunk, FinishChunk, TokenChunk
from exo_p2p.types.tasks import ChatMessage, GenerationParams, OutputFormat
from worker.engine.scheduler import Engine


MAX_STEPS = 20_000
CHUNK = 16
PROMPTS = [
    "hello",
    "What is the capital of France?",
    "and the cat sat on the mat, " * 10,  # several prefill chunks of 16
    "héllo wörld 日本語 🙂",
]
Request = tuple[str, GenerationParams]


def user(text: str) -> tuple[ChatMessage, ...]:
    return (ChatMessage("user", text),)


def requests(n: int = 12) -> list[Request]:
    """``n`` requests (task id, parameters) with different prompt lengths, max_tokens, stop
    strings, seeds and temperatures (every third one sampled with its seed, the rest greedy);
    every fifth, from the third, constrained to a regex (structured output's split step)."""
    return [
        (f"t{i}", GenerationParams(
            messages=user(PROMPTS[i % len(PROMPTS)] + f" {i}"),
            max_tokens=8 + 5 * i,
            temperature=0.8 if i % 3 == 0 else 0.0,
            seed=100 + i,
            stop=("e",) if i % 4 == 1 else (),
            output_format=OutputFormat("regex", "[a-z ]{1,60}") if i % 5 == 2 else None,
        ))
        for i in range(n)
    ]


def drive(gen: Engine, *, cancel_after: dict[str, int] | None = None,
          ids: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """Step ``gen`` until idle: token ids, text and finish per task, and the largest batch
    seen. ``cancel_after``: task id → cancel it once it has that many tokens; ``ids``: the
    token ids sampled before (``watch_tokens``), added to."""
    ids = ids if ids is not None else {}
    gen.on_token = lambda t, tok: ids.setdefault(t, []).append(tok)
    texts: dict[str, str] = {}
    finish: dict[str, Any] = {}
    largest = 0
    for _ in range(MAX_STEPS):
        if not gen.has_work():
            break
        for chunk in gen.step():
            if isinstance(chunk, TokenChunk):
                texts[chunk.task_id] = texts.get(chunk.task_id, "") + chunk.text
            elif isinstance(chunk, FinishChunk):
                finish[chunk.task_id] = (chunk.finish_reason, chunk.completion_tokens)
            elif isinstance(chunk, ErrorChunk):
                finish[chunk.task_id] = ("error", chunk.error.message)
        largest = max(largest, gen.batch_size)
        for task_id, n in (cancel_after or {}).items():
            if len(ids.get(task_id, ())) >= n:
                gen.cancel(task_id)
    else:
        raise AssertionError(f"generator still busy after {MAX_STEPS} steps")
    return {"ids": ids, "texts": texts, "finish": finish, "largest": largest}
