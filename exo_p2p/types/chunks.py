"""Chunks: pieces of a response, streamed from rank 0's runner to the API node that owns
the request (never through the replicated State; docs/architecture.md#request-flow)."""

from __future__ import annotations

from typing import Literal

import msgspec

from exo_p2p.types.common import ErrorInfo, TaskId
from exo_p2p.types.tasks import ToolCall

FinishReason = Literal["stop", "length", "cancelled", "tool_calls"]


class _Chunk(msgspec.Struct, frozen=True, tag=True, tag_field="kind"):
    task_id: TaskId


class PrefillProgressChunk(_Chunk, tag="prefill_progress"):
    """``processed`` of ``total`` prompt tokens are prefilled. The first one (processed 0)
    says the runner accepted the request: the prompt fits the context."""

    processed: int
    total: int


class TokenChunk(_Chunk, tag="token"):
    """New text (may be empty while a possible stop string is held back) and how many
    completion tokens have been generated so far. ``token_id``: the generated token whose
    text this is (None for the text flushed at the end), so the requesting node can resume
    the request elsewhere from exactly the tokens it has sent (``exo_p2p.api.resume``)."""

    text: str
    completion_tokens: int
    token_id: int | None = None
    reasoning: str = ""
    """Reasoning text of this token (a thinking model's think block), apart from ``text``."""
    calls: tuple[ToolCall, ...] = ()
    """Tool calls this token completed (parsed out of the output: never in ``text``)."""


class FinishChunk(_Chunk, tag="finish"):
    """The last chunk of a successful or cancelled generation; times in seconds.
    ``stop_sequence`` is the stop string that ended it (None for an end-of-turn token);
    ``cached_tokens``: prompt tokens taken from the prompt cache instead of prefilled;
    ``ttft``: from the task's arrival at its runner's engine to its first token, of which
    ``queued`` waiting in the engine's queue (the rest: prefill, with the group it joined)."""

    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    ttft: float = 0.0
    decode_tokens_per_second: float = 0.0
    stop_sequence: str | None = None
    cached_tokens: int = 0
    queued: float = 0.0


class ErrorChunk(_Chunk, tag="error"):
    """The generation ended with an error (``error.status`` is the HTTP status to report)."""

    error: ErrorInfo


Chunk = PrefillProgressChunk | TokenChunk | FinishChunk | ErrorChunk
