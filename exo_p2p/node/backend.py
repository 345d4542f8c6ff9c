"""The API's backend on one node (``exo_p2p.api.backend.ApiBackend``): each answer read, at the
moment it is asked, from the parts it is handed (``BackendParts``: the State's replica, the
cluster member, the host, the chunk router, the models, the hub, the token counter) and from its
counter sources; plus what the model routes use beyond the protocol (``depot``, ``pulls``,
``resolve_node``, ``models_changed``). Placement questions are answered with the master's rules,
injected by the node (``exo_p2p.node.placement``): this module imports no role, and not the node."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from exo_p2p.api.backend import NodeHealth, NodeSummary
from exo_p2p.node.status import health_counters, health_warnings, node_summaries
from exo_p2p.types import Chunk, Command, CommandResult, ErrorInfo, GenerationParams, ModelCard, State

if TYPE_CHECKING:  # the parts' types only; the node imports them to build the parts
    from exo_p2p.chunks.router import ChunkRouter
    from exo_p2p.cluster.event_times import EventTimesView
    from exo_p2p.cluster.member import ClusterMember
    from exo_p2p.models.hub.announce import HubModels
    from exo_p2p.models.stores.announce import LocalModels
    from exo_p2p.models.depot.depot import ModelDepot
    from exo_p2p.models.depot.pulls import PullManager
    from exo_p2p.models.token_count import TokenCounter
    from exo_p2p.net import Network
    from exo_p2p.replica import Replica

CounterSource = Callable[[], Mapping[str, int]]
"""A part's counters as ``GET /state`` shows them, read when asked."""


@dataclass(frozen=True)
class BackendParts:
    """The running node's parts the backend reads (all built by ``exo_p2p.node.node.Node``)."""

    node_id: str
    replica: Replica
    member: ClusterMember
    net: Network
    router: ChunkRouter
    models: LocalModels
    hub_models: HubModels
    tokens: TokenCounter
    depot: ModelDepot
    pulls: PullManager
    mdns: bool
    """Whether mDNS discovery is on (``NodeHealth.mdns``)."""


class NodeBackend:
    """``ApiBackend`` of a running node. ``counters`` are the counter sources of ``GET /state``
    after the host's and the member's own, in order (a later source's count of the same name
    wins: ``exo_p2p.node.status.health_counters``). ``previews(state, model_id, nodes)`` and
    ``resolve_node(state, name)`` are ``exo_p2p.node.placement``'s."""

    def __init__(self, parts: BackendParts, counters: Sequence[CounterSource],
                 previews: Callable[[State, str, tuple[str, ...]], list[dict]],
                 resolve_node: Callable[[State, str], str]) -> None:
        self._parts = parts
        self._counters = tuple(counters)
        self._previews = previews
        self._resolve_node = resolve_node

    @property
    def node_id(self) -> str:
        """This node's id."""
        return self._parts.node_id

    @property
    def depot(self) -> ModelDepot:
        """The node's model depot (models travel between nodes)."""
        return self._parts.depot

    @property
    def pulls(self) -> PullManager:
        """The node's model pulls."""
        return self._parts.pulls

    def state(self) -> State:
        """This node's replicated State."""
        return self._parts.replica.state

    def health(self) -> NodeHealth:
        """``GET /state``'s node part: warnings and every part's counters (``exo_p2p.node.status``)."""
        member, net = self._parts.member, self._parts.net
        warnings = health_warnings(alone_for=member.alone_for(), peer_left=bool(member.peers.disconnected_at),
                                   duplicate_identity=member.duplicate_identity, master=member.master,
                                   bootstrap_failures=net.bootstrap_failures)
        counters = health_counters(net.counters, member.counters, {"local_events_pending": member.local_events_pending},
                                   *(source() for source in self._counters))
        return NodeHealth(node_id=self.node_id, master=self.state().master, warnings=warnings, counters=counters,
                          mdns=self._parts.mdns)

    def nodes(self) -> list[NodeSummary]:
        """``GET /nodes``: every node this node knows (``exo_p2p.node.status.node_summaries``)."""
        return node_summaries(self.state(), self.node_id, self._parts.member.last_seen)

    def local_models(self) -> list[ModelCard]:
        """The model cards this node's store lists."""
        return list(self._parts.models.cards)

    async def command(self, command: Command, timeout: float = 30.0) -> CommandResult:
        """Send ``command`` to the master; a placement of a model no node holds whose name is a
        hub repo id is read from the hub first (``HubModels.before_command``)."""
        command, failed = await self._parts.hub_models.before_command(command)
        if failed is not None:
            return failed
        return await self._parts.member.command(command, timeout)

    async def read_from_hub(self, name: str) -> tuple[str, ErrorInfo | None]:
        """``HubModels.preview``: model ``name``'s card read from a hub for previews on this
        node only (State unchanged: only a placement adds a hub model)."""
        return await self._parts.hub_models.preview(name)

    def open_chunks(self, task_id: str) -> trio.MemoryReceiveChannel[Chunk]:
        """Register for the chunks of ``task_id`` before it is submitted (``ChunkRouter.open``)."""
        return self._parts.router.open(task_id)

    def close_chunks(self, task_id: str) -> None:
        """Unregister ``task_id``'s chunks (idempotent)."""
        self._parts.router.close(task_id)

    def event_times(self, since: int) -> EventTimesView:
        """The cluster member's publish/receive/apply times of event indices ``since..``."""
        return self._parts.member.event_times.since(since)

    def resolve_node(self, name: str) -> str:
        """The node id for ``name`` (a node id, a friendly name or a unique id prefix).
        Raises ``ValueError`` naming an unknown or ambiguous name (the API answers 400)."""
        return self._resolve_node(self.state(), name)

    def previews(self, model_id: str, nodes: tuple[str, ...]) -> list[dict]:
        """Placement previews of ``model_id`` as plain dicts; raises ``KeyError`` for an
        unknown model. A hub model's card read for previews (``HubModels.preview_state``)
        counts as known here."""
        return self._previews(self._parts.hub_models.preview_state(self.state(), model_id), model_id, nodes)

    async def count_tokens(self, model_id: str, params: GenerationParams) -> int:
        """The prompt of ``params`` tokenized with the tokenizer of this node's copy of
        ``model_id`` (kept, and loaded at placement: ``exo_p2p.models.token_count``). Raises
        ``KeyError`` when the model is not stored here, ``ValueError`` when its chat template
        fails."""
        return await self._parts.tokens.count(model_id, params)

    async def tokenize(self, model_id: str, texts: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        """``texts`` tokenized with this node's copy of ``model_id``'s tokenizer (embeddings'
        inputs); raises ``KeyError`` when the model is not stored here."""
        return await self._parts.tokens.encode(model_id, texts)

    async def models_changed(self) -> None:
        """Re-list this node's models after a pull or a removal."""
        await self._parts.models.load()
