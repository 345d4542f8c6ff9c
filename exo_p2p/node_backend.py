"""The API's backend on one node (``exo_p2p.api.backend.ApiBackend``): each answer read from
the node's parts at the moment it is asked (its State, cluster member, host, chunk router,
models, hub, token counter), plus what the model routes use beyond the protocol (``depot``,
``pulls``, ``resolve_node``, ``models_changed``). Placement questions are answered with the
master's rules, injected by the node (``exo_p2p.node_placement``): this module imports no role."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from exo_p2p.api.backend import NodeHealth, NodeSummary
from exo_p2p.status import health_counters, health_warnings, node_summaries
from exo_p2p.types import Chunk, Command, CommandResult, ErrorInfo, ModelCard, State

if TYPE_CHECKING:
    from exo_p2p.node import Node


class NodeBackend:
    """``ApiBackend`` of ``node``. ``health``, ``nodes``, ``command`` and ``event_times``
    need the node running (its host and cluster member built); the rest answer from the
    moment the node is built. ``previews(state, model_id, nodes)`` and
    ``resolve_node(state, name)`` are ``exo_p2p.node_placement``'s."""

    def __init__(self, node: Node, previews: Callable[[State, str, tuple[str, ...]], list[dict]],
                 resolve_node: Callable[[State, str], str]) -> None:
        self._node = node
        self._previews = previews
        self._resolve_node = resolve_node

    @property
    def node_id(self) -> str:
        """This node's id."""
        return self._node.node_id

    @property
    def depot(self):  # type: ignore[no-untyped-def]
        """The node's ``exo_p2p.models.depot.ModelDepot``."""
        return self._node.depot

    @property
    def pulls(self):  # type: ignore[no-untyped-def]
        """The node's ``exo_p2p.models.pulls.PullManager`` (None until the node runs)."""
        return self._node.pulls

    def state(self) -> State:
        """This node's replicated State."""
        return self._node.replica.state

    def health(self) -> NodeHealth:
        """``GET /state``'s node part: warnings and every part's counters (``exo_p2p.status``)."""
        node = self._node
        member, net, router = node.member, node.net, node.router
        warnings = health_warnings(alone_for=member.alone_for(), peer_left=bool(member.peers.disconnected_at),
                                   duplicate_identity=member.duplicate_identity, master=member.master,
                                   bootstrap_failures=net.bootstrap_failures)
        own = {"chunks_undeliverable": router.undeliverable, "chunk_not_from_rank0": node.routes.refused,
               "chunks_duplicate": router.duplicates, "chunk_stream_gaps": router.gaps, "tasks_lost": router.lost,
               "orphaned_tasks_cancelled": node.orphans.cancelled,
               "loop_lag_worst_ms": int(node.loop_watch.worst_lag * 1000),  # exo_p2p.loop_watch
               "loop_lag_late_wakes": node.loop_watch.late}
        if node.prober is not None:  # links measured (docs/links.md)
            own.update(link_rounds=node.prober.rounds, link_events=node.prober.events,
                       link_probes_served=node.probes.served, link_probes_refused=node.probes.refused)
        counters = health_counters(net.counters, member.counters,
                                   {"local_events_pending": member.local_events_pending}, node.seat.counters, own)
        return NodeHealth(node_id=node.node_id, master=node.replica.state.master, warnings=warnings, counters=counters,  # type: ignore[arg-type]
                          mdns=node.config.mdns)

    def nodes(self) -> list[NodeSummary]:
        """``GET /nodes``: every node this node knows (``exo_p2p.status.node_summaries``)."""
        return node_summaries(self._node.replica.state, self._node.node_id, self._node.member.last_seen)

    def local_models(self) -> list[ModelCard]:
        """The model cards this node's store lists."""
        return list(self._node.models.cards)

    async def command(self, command: Command, timeout: float = 30.0) -> CommandResult:
        """Send ``command`` to the master; a placement of a model no node holds whose name is a
        hub repo id is read from the hub first (``HubModels.before_command``)."""
        command, failed = await self._node.hub_models.before_command(command)
        if failed is not None:
            return failed
        return await self._node.member.command(command, timeout)

    async def read_from_hub(self, name: str) -> tuple[str, ErrorInfo | None]:
        """``HubModels.preview``: model ``name``'s card read from a hub for previews on this
        node only (State unchanged: only a placement adds a hub model)."""
        return await self._node.hub_models.preview(name)

    def open_chunks(self, task_id: str) -> trio.MemoryReceiveChannel[Chunk]:
        """Register for the chunks of ``task_id`` before it is submitted (``ChunkRouter.open``)."""
        return self._node.router.open(task_id)

    def close_chunks(self, task_id: str) -> None:
        """Unregister ``task_id``'s chunks (idempotent)."""
        self._node.router.close(task_id)

    def event_times(self, since: int):  # type: ignore[no-untyped-def]
        """The cluster member's publish/receive/apply times of event indices ``since..``."""
        return self._node.member.event_times.since(since)

    def resolve_node(self, name: str) -> str:
        """The node id for ``name`` (a node id, a friendly name or a unique id prefix).
        Raises ``ValueError`` naming an unknown or ambiguous name (the API answers 400)."""
        return self._resolve_node(self._node.replica.state, name)

    def previews(self, model_id: str, nodes: tuple[str, ...]) -> list[dict]:
        """Placement previews of ``model_id`` as plain dicts; raises ``KeyError`` for an
        unknown model. A hub model's card read for previews (``HubModels.preview_state``)
        counts as known here."""
        return self._previews(self._node.hub_models.preview_state(self._node.replica.state, model_id), model_id, nodes)

    async def count_tokens(self, model_id: str, params) -> int:  # type: ignore[no-untyped-def]
        """The prompt of ``params`` tokenized with the tokenizer of this node's copy of
        ``model_id`` (kept, and loaded at placement: ``exo_p2p.models.token_count``). Raises
        ``KeyError`` when the model is not stored here, ``ValueError`` when its chat template
        fails."""
        return await self._node.tokens.count(model_id, params)

    async def tokenize(self, model_id: str, texts: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        """``texts`` tokenized with this node's copy of ``model_id``'s tokenizer (embeddings'
        inputs); raises ``KeyError`` when the model is not stored here."""
        return await self._node.tokens.encode(model_id, texts)

    async def models_changed(self) -> None:
        """Re-list this node's models after a pull or a removal."""
        await self._node.models.load()
