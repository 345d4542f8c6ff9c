"""The contract between the HTTP API and the node that serves it.

The API is the one door for CLI and OpenAI clients (docs/architecture.md#layers); it never touches the
network, the master or the worker directly, only this protocol, which the node (the
composition root) implements. Tests implement it with fakes.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec
import trio

from exo_p2p.types import (Chunk, Command, CommandResult, ErrorInfo, GenerationParams, ModelCard, ModelId, NodeId, NodeSpeed, State,
                           TaskId)


class LinkSummary(msgspec.Struct, frozen=True):
    """One measured address of a link from a node: the ``sink`` node reached at ``address``,
    its RTT in µs and bandwidth in bytes/s (None: not measured yet) and the sink's
    ``interface_type`` there (``State.links``, docs/links.md)."""

    sink: NodeId
    address: str
    rtt_us: int
    bytes_per_s: int | None
    interface_type: str


class NodeSummary(msgspec.Struct, frozen=True):
    """One node as ``GET /nodes`` lists it (memory in bytes; None = not yet reported).

    ``addrs`` are dialable multiaddrs ending in ``/p2p/<node_id>``; ``last_seen`` is seconds
    since this node last heard from it (0 for itself), by this node's monotonic clock.
    ``links`` are the figures this node measured of every address of each peer.
    """

    node_id: NodeId
    friendly_name: str
    is_self: bool
    is_master: bool
    memory_total: int | None
    memory_available: int | None
    addrs: list[str]
    last_seen: float
    links: list[LinkSummary] = msgspec.field(default_factory=list)
    speed: NodeSpeed | None = None
    """The node's measured speed (None: not measured; docs/placement-speed.md)."""


class NodeHealth(msgspec.Struct, frozen=True):
    """Node-local facts for ``GET /state`` (not part of the replicated State or its hash):
    warnings such as "no peers found for 12 s", and counters of dropped messages by kind;
    ``mdns``: whether this node announces and browses mDNS (False with ``--no-mdns``; None:
    not said, as from a backend without discovery)."""

    node_id: NodeId
    master: NodeId | None
    warnings: list[str]
    counters: dict[str, int]
    mdns: bool | None = None


class ApiBackend(Protocol):
    """What the API needs from its node.

    - ``state()``: the node's current replicated State (cheap; read-only).
    - ``health()``: node-local status for ``/state``.
    - ``nodes()``: every node this node knows, for ``GET /nodes``.
    - ``local_models()``: the model cards this node can serve from its own store.
    - ``command(cmd, timeout)``: send a command to the master and await its
      ``CommandResult`` (errors are in ``result.error`` with the HTTP status to answer;
      a master that cannot be reached within ``timeout`` seconds gives a 503 error result —
      this never raises for a command-level failure).
    - ``open_chunks(task_id)``: register to receive the chunks of ``task_id`` BEFORE
      submitting it; returns a receive channel that yields chunks in order and is closed
      after a ``FinishChunk`` or ``ErrorChunk``. The node guarantees an ``ErrorChunk`` if the
      task's instance or runner fails (so reading never hangs forever).
    - ``close_chunks(task_id)``: unregister (idempotent).
    - ``previews(model_id, nodes)``: placement previews as plain dicts (``master.placement.place``), or raise
      ``KeyError`` for an unknown model.
    - ``read_from_hub(name)``: read the card of a model no node holds from a model hub
      (``ORG/NAME[@REV]``; docs/models.md#models-from-a-hub) for ``previews`` on this node
      only, never into State (only a placement adds a hub model to the cluster):
      ``(model id, None)`` when known now or not a hub model at all (then still unknown),
      ``(model id, error)`` naming why the hub cannot give it (status 404, 400, 502 or
      504); never raises.
    - ``event_times(since)``: the node's publish/receive/apply times of event indices
      ``since..`` (an ``exo_p2p.cluster.event_times.EventTimesView``; seconds of
      CLOCK_MONOTONIC), or None when the node records none.
    - ``count_tokens(model_id, params)``: the prompt tokens of ``params`` with the model's
      tokenizer and chat template; raises ``KeyError`` when this node holds no copy of the
      model, ``ValueError`` when the template fails.
    - ``tokenize(model_id, texts)``: each text's token ids with the model's tokenizer (special
      tokens added, no template: embeddings); raises ``KeyError`` as ``count_tokens``.
    """

    @property
    def node_id(self) -> NodeId: ...

    def state(self) -> State: ...

    def health(self) -> NodeHealth: ...

    def nodes(self) -> list[NodeSummary]: ...

    def local_models(self) -> list[ModelCard]: ...

    async def command(self, command: Command, timeout: float = 30.0) -> CommandResult: ...

    def open_chunks(self, task_id: TaskId) -> trio.MemoryReceiveChannel[Chunk]: ...

    def close_chunks(self, task_id: TaskId) -> None: ...

    def previews(self, model_id: str, nodes: tuple[str, ...]) -> list[dict]: ...

    async def read_from_hub(self, name: str) -> tuple[str, ErrorInfo | None]: ...

    def event_times(self, since: int) -> Any: ...

    async def count_tokens(self, model_id: ModelId, params: GenerationParams) -> int: ...

    async def tokenize(self, model_id: ModelId, texts: tuple[str, ...]) -> tuple[tuple[int, ...], ...]: ...
