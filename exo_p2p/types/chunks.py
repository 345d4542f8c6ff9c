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


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True):
    """One token's log-probability (natural log) under the model: its id, its text (the
    tokenizer's decoding of the id alone) and the value."""

    token_id: int
    text: str
    logprob: float


class TokenLogprobs(msgspec.Struct, frozen=True, array_like=True):
    """The generated token's ``TokenLogprob`` and the ``top`` most likely ones (most likely
    first; as many as the request asked for, at most ``MAX_TOP_LOGPROBS``)."""

    chosen: TokenLogprob
    top: tuple[TokenLogprob, ...] = ()


class TokenChunk(_Chunk, tag="token"):
    """New text (may be empty while a possible stop string is held back) and how many
    completion tokens have been generated so far. ``token_id``: the generated token whose
    text this is (None for the text flushed at the end), so the requesting node can resume
    the request elsewhere from exactly the tokens it has sent (``exo_p2p.api.generation.resume``)."""

    text: str
    completion_tokens: int
    token_id: int | None = None
    reasoning: str = ""
    """Reasoning text of this token (a thinking model's think block), apart from ``text``."""
    calls: tuple[ToolCall, ...] = ()
    """Tool calls this token completed (parsed out of the output: never in ``text``)."""
    logprobs: TokenLogprobs | None = None
    """The token's log-probabilities when the request asked for them (``GenerationParams.logprobs``)."""


class FinishChunk(_Chunk, tag="finish"):
    """The last chunk of a successful or cancelled generation; times in seconds.
    ``stop_sequence`` is the stop string that ended it (None for an end-of-turn token);
    ``cached_tokens``: prompt tokens taken from the prompt cache instead of prefilled;
    ``ttft``: from the task's arrival at its runner's engine to its first token, of which
    ``queued`` waiting in the engine's queue (the rest: prefill, with the group it joined);
    ``draft_proposed``/``draft_accepted``: speculative decoding's drafted tokens verified and
    accepted for this task (``worker/engine/spec/``)."""

    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    ttft: float = 0.0
    decode_tokens_per_second: float = 0.0
    stop_sequence: str | None = None
    cached_tokens: int = 0
    draft_proposed: int = 0
    draft_accepted: int = 0
    queued: float = 0.0


class ErrorChunk(_Chunk, tag="error"):
    """The generation ended with an error (``error.status`` is the HTTP status to report)."""

    error: ErrorInfo


EMBEDDING_CHUNK_BYTES = 4 * 1024 * 1024
"""Bytes of vectors one ``EmbeddingChunk`` carries at most (2,048 inputs of 4,096 dimensions
are 32 MiB: eight parts); a row wider than it travels alone. Chunks travel in batches
under ``exo_p2p.defaults.CHUNK_BATCH_BYTES``."""


class EmbeddingChunk(_Chunk, tag="embedding"):
    """The vectors of an ``Embedding`` task (one per input, in the inputs' order) or the
    scores of a ``Rerank`` task (one per document, ``dimensions`` 1): ``count`` rows of
    ``dimensions`` float32 values, little-endian, row after row, in ``vectors`` (so
    ``len(vectors) == count * dimensions * 4``); ``prompt_tokens``: the tokens the inputs
    held (usage). A task's rows come in parts of at most ``EMBEDDING_CHUNK_BYTES`` each, in
    order (the API node joins them); a ``FinishChunk`` follows the last. ``rows()`` reads a
    part back."""

    vectors: bytes
    count: int
    dimensions: int
    prompt_tokens: int = 0

    def rows(self) -> list[list[float]]:
        """The vectors as lists of floats. Raises ``ValueError`` when ``vectors`` does not
        hold ``count × dimensions`` float32 values."""
        import numpy as np

        if self.count < 0 or self.dimensions < 0 or len(self.vectors) != self.count * self.dimensions * 4:
            raise ValueError(f"embedding chunk of {len(self.vectors)} bytes is not {self.count} x {self.dimensions} float32")
        return np.frombuffer(self.vectors, dtype="<f4").reshape(self.count, self.dimensions).tolist()


class ImageChunk(_Chunk, tag="image"):
    """An image of an image task, PNG bytes in ``image`` (``width`` × ``height`` pixels):
    a partial one (``partial``: the latents after ``step`` of ``steps``, its ``index`` 0, 1…)
    or the final one (``partial`` False, ``step == steps``); ``seconds``: from the task's start
    on its engine. A ``FinishChunk`` follows the final one."""

    image: bytes
    width: int
    height: int
    step: int
    steps: int
    partial: bool = False
    index: int = 0
    seconds: float = 0.0


class ImageProgressChunk(_Chunk, tag="image_progress"):
    """Denoising step ``step`` of ``steps`` of an image task is done, ``seconds`` from the
    task's start on its engine: sent after every step when the task's ``ImageParams.progress``
    asks (a progress bar's ticks; docs/images.md#progress). At most ``steps`` per task."""

    step: int
    steps: int
    seconds: float = 0.0


Chunk = PrefillProgressChunk | TokenChunk | FinishChunk | ErrorChunk | EmbeddingChunk | ImageChunk | ImageProgressChunk
