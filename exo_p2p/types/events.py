"""Events: facts, applied in the master's index order by every node (docs/architecture.md#vocabulary)."""

from __future__ import annotations

import msgspec

from exo_p2p.types.common import PROTOCOL_VERSION, InstanceId, NodeId, RunnerId, TaskId
from exo_p2p.types.instances import Instance
from exo_p2p.types.models import HubSource, ModelCard
from exo_p2p.types.runner import RunnerStatus
from exo_p2p.types.tasks import TaskStatus, WorkTask
from exo_p2p.types.topology import LinkFigures, NodeProfile, TopologyEdge


class _Event(msgspec.Struct, frozen=True, tag=True, tag_field="kind"):
    pass


class NodeProfileUpdated(_Event, tag="node_profile_updated"):
    profile: NodeProfile


class NodeModelsUpdated(_Event, tag="node_models_updated"):
    """``node_id`` holds these models; their cards enter ``State.model_cards``."""

    node_id: NodeId
    cards: tuple[ModelCard, ...]


class HubModelResolved(_Event, tag="hub_model_resolved"):
    """``node_id`` read model ``card.model_id`` from a model hub (``source``): its card enters
    ``State.model_cards`` (unless a node's own copy already gave one) and its source
    ``State.hub_models``, so placement may put it on nodes that fetch it (docs/models.md)."""

    node_id: NodeId
    card: ModelCard
    source: HubSource


class HubModelsForgotten(_Event, tag="hub_models_forgotten"):
    """The master forgets these models read from a hub: unused for a while
    (``exo_p2p.state.hub_cards``); each one no instance uses nor node holds when applied
    leaves ``State.hub_models`` and its card ``State.model_cards``."""

    model_ids: tuple[str, ...]


class NodeTimedOut(_Event, tag="node_timed_out"):
    node_id: NodeId


class TopologyEdgeCreated(_Event, tag="topology_edge_created"):
    edge: TopologyEdge


class TopologyEdgesCreated(_Event, tag="topology_edges_created"):
    """Several edges from one node (every edge's ``source`` is the same), announced together:
    a node that connects to N peers at once sends a few events, not N (each event costs every
    node an apply that copies the edge maps: docs/cluster.md, "Many machines"). At most
    ``MAX_EDGES_PER_EVENT`` edges."""

    edges: tuple[TopologyEdge, ...]


MAX_EDGES_PER_EVENT = 256
"""Edges in one ``TopologyEdgesCreated`` at most (a larger one is refused by the master)."""


class TopologyEdgeDeleted(_Event, tag="topology_edge_deleted"):
    source: NodeId
    sink: NodeId


class LinkMeasured(_Event, tag="link_measured"):
    """``source`` measured the address ``figures.address`` of ``sink`` (``State.links``); sent
    only when the figures moved by a stated fraction (``exo_p2p.links.figures.moved``)."""

    source: NodeId
    sink: NodeId
    figures: LinkFigures


class LinkLost(_Event, tag="link_lost"):
    """``source`` can no longer reach ``sink`` at ``address`` (probes failed)."""

    source: NodeId
    sink: NodeId
    address: str


class MasterElected(_Event, tag="master_elected"):
    node_id: NodeId
    term: int


class InstanceCreated(_Event, tag="instance_created"):
    instance: Instance


class InstanceDeleted(_Event, tag="instance_deleted"):
    """The instance is gone. ``reason``, when the master unloaded it on its own: ``idle`` (past
    its keep-alive), ``request`` (a request's ``keep_alive: 0``), ``room`` (handed over to a
    placement that did not fit); None for a deletion by hand, a re-placement or a switch
    (every node counts unloads by reason from it: ``exo_p2p.metrics.collect``)."""

    instance_id: InstanceId
    reason: str | None = None


class InstanceFailed(_Event, tag="instance_failed"):
    """The instance failed (``final``: and the master gave up re-placing it; the reason then
    says why)."""

    instance_id: InstanceId
    reason: str
    final: bool = False


class InstanceUsed(_Event, tag="instance_used"):
    """``instance_id`` was used at ``at`` (unix seconds, the master's clock): a request started
    or ended on it, or it was placed with a keep-alive. ``keep_alive``: the keep-alive to keep
    from now on (seconds; negative: forever), None: unchanged (``State.usage``,
    ``exo_p2p.state.usage``). ``pinned``/``on_demand`` are set at placement only."""

    instance_id: InstanceId
    at: float
    keep_alive: float | None = None
    pinned: bool | None = None
    on_demand: bool | None = None
    task: bool = False
    """A request started on it (``InstanceUsage.served``)."""


class RunnerStatusUpdated(_Event, tag="runner_status_updated"):
    runner_id: RunnerId
    instance_id: InstanceId
    node_id: NodeId
    status: RunnerStatus


class InstancePrefixesUpdated(_Event, tag="instance_prefixes_updated"):
    """The prefixes rank 0's prompt cache of ``instance_id`` holds now, as digests
    (``exo_p2p.content.prefixes``; at most ``MAX_DIGESTS``, most recently used last): the master
    routes a request to the instance holding its longest prefix (``master.routing``)."""

    instance_id: InstanceId
    digests: tuple[int, ...]


class RunnerDeleted(_Event, tag="runner_deleted"):
    runner_id: RunnerId


class TaskCreated(_Event, tag="task_created"):
    """The master gave ``task`` (any kind of work, ``WorkTask``) to its instance."""

    task: WorkTask


class TaskStatusUpdated(_Event, tag="task_status_updated"):
    task_id: TaskId
    status: TaskStatus


class TaskCancelRequested(_Event, tag="task_cancel_requested"):
    task_id: TaskId


class TaskDeleted(_Event, tag="task_deleted"):
    task_id: TaskId


Event = (
    NodeProfileUpdated
    | NodeModelsUpdated
    | HubModelResolved
    | HubModelsForgotten
    | NodeTimedOut
    | TopologyEdgeCreated
    | TopologyEdgesCreated
    | TopologyEdgeDeleted
    | LinkMeasured
    | LinkLost
    | MasterElected
    | InstanceCreated
    | InstanceDeleted
    | InstanceFailed
    | InstanceUsed
    | RunnerStatusUpdated
    | InstancePrefixesUpdated
    | RunnerDeleted
    | TaskCreated
    | TaskStatusUpdated
    | TaskCancelRequested
    | TaskDeleted
)


class LocalEvent(msgspec.Struct, frozen=True):
    """An event a node produced, sent to the master with a per-origin sequence number
    (``origin_seq`` starts at 1 per boot and has no gaps); re-sent until seen indexed."""

    origin: NodeId
    origin_boot: str
    origin_seq: int
    event: Event
    version: int = PROTOCOL_VERSION


class IndexedEvent(msgspec.Struct, frozen=True):
    """An event as the master sequenced it: ``idx`` starts at 1 and has no gaps; ``term`` is
    the master's term. ``origin``/``origin_seq`` identify the local event it came from
    (empty/0 for events the master made itself)."""

    term: int
    idx: int
    event: Event
    origin: str = ""
    origin_boot: str = ""
    origin_seq: int = 0
    version: int = PROTOCOL_VERSION
