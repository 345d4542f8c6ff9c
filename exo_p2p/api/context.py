"""What every route of the API shares: the backend, the settings, the in-flight counter.

``ApiContext`` is built once per app by ``exo_p2p.api.routes.api_routes`` and handed to each
family's routes (``exo_p2p.api.families``); ``read_json`` is the one way a route reads a
request body into a Struct, and ``generate`` the one way it answers a generation.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
import trio

from starlette.requests import Request

from exo_p2p.api.backend import ApiBackend
from exo_p2p.api.body import DEFAULT_MAX_BODY_BYTES, read_body
from exo_p2p.api.bounds import COUNT_TOKENS_CONCURRENCY, check_command_size, check_count_tokens_size
from exo_p2p.api.generation.client_key import CLIENT_KEY_MAX
from exo_p2p.api.demand.aliases import cluster_aliases, resolve
from exo_p2p.api.errors import ApiError, decode_json
from exo_p2p.api.generation.path import GenerationResponse
from exo_p2p.api.generation.job import GenerationJob, GenerationSettings, InFlight
from exo_p2p.api.generation.resume import MoveCounters
from exo_p2p.metrics.observer import Observer
from exo_p2p.models.names import canonical_model_name
from exo_p2p.types import GenerationParams, ModelCard, ModelId, NodeId, SubmitTask, new_id
from exo_p2p.vision.fetch import ImageUrlPolicy

T = TypeVar("T")

CHECK_THREADS = 2
"""Requests whose formats and tool schemas are checked at once, each in a worker thread."""


@dataclass
class ApiConfig:
    """Settings of one API: model aliases (alias → model id), the in-flight generation limit
    (None = unlimited), the request body limit in bytes, the generation waits, the
    observer of finished requests and the reasoning sealing key."""

    model_aliases: Mapping[str, str]
    queue_limit: int | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    generation: GenerationSettings = GenerationSettings()
    command_timeout: float = 30.0
    observer: Observer = field(default_factory=Observer)
    """Where finished requests' records go (metrics, the request log)."""
    image_urls: ImageUrlPolicy = ImageUrlPolicy()
    """Whether image URLs in requests are fetched (``--allow-image-urls``; ``exo_p2p.vision.fetch``)."""
    reasoning_key: bytes = field(default_factory=lambda: os.urandom(32))
    """The key sealing reasoning carried across Responses turns (``exo_p2p.api.families.openai.sealed_reasoning``;
    a node's is derived from its cluster secret, default: random for this API alone)."""


@dataclass
class ApiContext:
    """The backend and settings of one API, and the state its routes share: the in-flight
    generation counter, the ``count_tokens`` counter and the API's start time (Unix seconds,
    the ``created`` of models)."""

    backend: ApiBackend
    config: ApiConfig
    inflight: InFlight = field(init=False)
    counting: InFlight = field(default_factory=lambda: InFlight(COUNT_TOKENS_CONCURRENCY))
    """``count_tokens`` requests being tokenized (``exo_p2p.api.bounds.COUNT_TOKENS_CONCURRENCY``)."""
    moves: MoveCounters = field(default_factory=MoveCounters)
    """Requests this API moved after a failure, and those that then failed (``/state`` counters)."""
    started: int = field(default_factory=lambda: int(time.time()))
    checking: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(CHECK_THREADS))
    """Threads checking requests (``job``)."""

    def __post_init__(self) -> None:
        self.inflight = InFlight(self.config.queue_limit)

    async def job(self, build: Callable[..., T], *args: Any) -> T:
        """``build(*args)`` in a worker thread, at most ``CHECK_THREADS`` at once: building a
        request's job compiles its format and tool schemas with llguidance (up to about half a
        second for a 64 KiB schema, without the GIL), which would otherwise hold the event loop."""
        return await trio.to_thread.run_sync(build, *args, limiter=self.checking)

    def model_id(self, name: str) -> ModelId:
        """The model id a client's model name stands for (aliases resolved, the app's and the
        cluster's ``--alias``; an Ollama
        store's name without its tag means ``:latest``, ``exo_p2p.models.names.canonical_model_name``)."""
        given = canonical_model_name(self.config.model_aliases.get(name, name))
        state = self.backend.state()
        if given in state.model_cards or not any(node.aliases for node in state.nodes.values()):
            return ModelId(given)
        # the cluster's aliases (--alias on any node, globs included): exo_p2p.api.demand.aliases
        return ModelId(canonical_model_name(resolve(given, cluster_aliases(state, self.backend.node_id), state.model_cards.__contains__)))

    def card(self, name: str) -> ModelCard | None:
        """The cluster's card of model ``name`` (aliases resolved), or None."""
        return self.backend.state().model_cards.get(self.model_id(name))

    async def read_json(self, request: Request, type_: type[T]) -> T:
        """The request body decoded as ``type_`` (413 beyond the body limit, 400 when it does
        not decode; see ``exo_p2p.api.errors.decode_json``)."""
        return decode_json(await read_body(request, self.config.max_body_bytes), type_)

    async def count_tokens(self, model_id: str, params: GenerationParams) -> int:
        """Prompt tokens of ``params`` for ``model_id`` (the backend's tokenizer). Raises
        ``ApiError``: 413 for more text than ``MAX_COUNT_TOKENS_TEXT_BYTES``, 429 while
        ``COUNT_TOKENS_CONCURRENCY`` requests are being counted (``exo_p2p.api.bounds``), 404
        when this node holds no copy of the model (its tokenizer is needed), 400 when its
        chat template fails."""
        check_count_tokens_size(params)
        if not self.counting.try_acquire():
            raise ApiError(429, f"too many token counts at once: {self.counting.count} in progress on this node, "
                           f"limit {self.counting.limit}; retry", code="too_many_requests")
        try:
            return await self.backend.count_tokens(ModelId(model_id), params)
        except KeyError:
            raise ApiError(
                404,
                f"model {model_id[:200]!r} is not stored on this node, and counting tokens needs its tokenizer; ask a node that holds it",
                param="model",
                code="model_not_local",
            ) from None
        except ValueError as exc:
            raise ApiError(400, str(exc)[:2000], param="messages") from None
        finally:
            self.counting.release()

    def generate(self, job: GenerationJob) -> GenerationResponse:
        """The ASGI app answering ``job`` through the shared path. Raises ``ApiError(400)``
        when its ``SubmitTask`` would exceed ``exo_p2p.api.bounds.MAX_COMMAND_BYTES``
        (before anything is sent or counted). The client's key is set later, from the HTTP
        scope (``exo_p2p.api.generation.client_key``), so the check counts the longest one it can be."""
        widest = msgspec.structs.replace(job.params, client="k" * CLIENT_KEY_MAX)
        check_command_size(SubmitTask.generation(command_id=new_id(), task_id=job.task_id, model_id=ModelId(job.model_id),
                                                 params=widest, api_node_id=NodeId(self.backend.node_id)))
        return GenerationResponse(self.backend, job, self.inflight, self.config.generation, self.moves,
                                  observer=self.config.observer)
