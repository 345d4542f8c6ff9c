"""What a generation request is before it runs, and the plain ASGI answers around it: the
``GenerationJob`` every API family builds (model, ``GenerationParams``, streamed or not, the
family's ``StreamEncoder``), the waits that bound it (``GenerationSettings``), the count of
generations in flight (``InFlight``) and whole responses and errors (``send_bytes``,
``send_error``). ``exo_p2p.api.generation.path.GenerationResponse`` runs a job.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import msgspec
from starlette.types import Send

from exo_p2p.api.demand.placer import DemandPlacer
from exo_p2p.api.errors import Family, error_headers, family_error_body
from exo_p2p.api.generation.resume import FAIL_WAIT, MAX_MOVES, MOVE_BOUND
from exo_p2p.types import ErrorInfo, FinishChunk, GenerationParams, TaskId, new_id

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
"""Headers of every stream (no caching, no proxy buffering)."""


@dataclass(frozen=True)
class GenerationSettings:
    """Bounded waits of one generation, in seconds.

    ``chunk_timeout``: longest wait for the next chunk (queued requests wait here too, so it
    is generous; the node itself guarantees an ``ErrorChunk`` when a runner dies);
    ``command_timeout``: the wait for the master's answer to ``SubmitTask``;
    ``cancel_timeout``: the wait for ``CancelGeneration`` after a disconnect;
    ``keepalive_interval``: the longest a stream stays silent (must be < 10);
    ``max_moves``: times a request may move to another instance after a failure (0: never);
    ``move_bound``: the longest wait for a ready instance to accept a moved request;
    ``fail_wait``: how long a runner's 500 waits for its instance to fail before it is
    answered (``exo_p2p.api.generation.resume``).
    """

    chunk_timeout: float = 600.0
    command_timeout: float = 30.0
    cancel_timeout: float = 5.0
    keepalive_interval: float = 5.0
    max_moves: int = MAX_MOVES
    move_bound: float = MOVE_BOUND
    fail_wait: float = FAIL_WAIT
    demand: DemandPlacer | None = None
    """Placement on demand of a model with no ready instance (``exo_p2p.api.demand.placer``;
    None: such a request is refused 409/503 as the master answers, ``--no-place-on-demand``)."""


class StreamEncoder(Protocol):
    """A family's bytes for one generation (pure; one per request).

    ``family`` names the error shape; ``media_type`` is the stream's content type.
    ``start(prompt_tokens)`` are the first bytes of a stream (None when the prompt size is
    not known yet); ``text(delta)`` one text delta (may be empty bytes); ``finish(chunk)``
    the closing events; ``error(info)`` an in-stream error that ends the stream;
    ``keepalive()`` bytes that carry no content; ``body(text, chunk)`` a whole non-streamed
    answer (JSON). Reasoning and tool calls: ``exo_p2p.api.generation.turn.TurnEncoder``.
    """

    family: Family
    media_type: str

    def start(self, prompt_tokens: int | None) -> bytes: ...

    def text(self, delta: str) -> bytes: ...

    def finish(self, chunk: FinishChunk) -> bytes: ...

    def error(self, info: ErrorInfo) -> bytes: ...

    def keepalive(self) -> bytes: ...

    def body(self, text: str, chunk: FinishChunk) -> bytes: ...


@dataclass(frozen=True)
class GenerationJob:
    """A validated generation request of any family: what to run and how to answer."""

    model_id: str
    params: GenerationParams
    stream: bool
    encoder: StreamEncoder
    task_id: TaskId
    keep_alive: float | None = None
    """The request's keep-alive for its instance (seconds; negative: forever; None: the
    instance's own; ``exo_p2p.api.demand.keep_alive``)."""


def with_client(job: GenerationJob, client: str) -> GenerationJob:
    """``job`` with its parameters naming ``client`` (``exo_p2p.api.generation.client_key``)."""
    return dataclasses.replace(job, params=msgspec.structs.replace(job.params, client=client))


def new_task_id() -> TaskId:
    """A fresh task id (families name their response ids after it)."""
    return TaskId(new_id())


class InFlight:
    """Counts the generations this API is serving against an optional ``limit``.

    Single-threaded (trio): ``try_acquire`` and ``release`` never await, so no lock is needed.
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.count = 0

    def try_acquire(self) -> bool:
        """Take a slot; False when ``limit`` slots are already taken."""
        if self.limit is not None and self.count >= self.limit:
            return False
        self.count += 1
        return True

    def release(self) -> None:
        self.count -= 1


async def send_bytes(send: Send, status: int, body: bytes, headers: dict[str, str] | None = None,
                     media_type: str = "application/json") -> None:
    """Send a whole response (``status``, ``body``) through ASGI ``send``."""
    raw = [(b"content-type", media_type.encode()), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(send: Send, info: ErrorInfo, family: str = "openai") -> None:
    """Send ``info`` as a JSON error in ``family``'s shape with its status and headers."""
    status = info.status if 400 <= info.status <= 599 else 500
    await send_bytes(send, status, family_error_body(family, info), error_headers(info))
