"""The replicated State: what every node knows, built only by ``apply`` (docs/architecture.md#request-flow)."""

from __future__ import annotations

import msgspec

from exo_p2p.types.common import InstanceId, ModelId, NodeId, RunnerId, TaskId
from exo_p2p.types.instances import Instance, InstanceUsage
from exo_p2p.types.models import HubSource, ModelCard
from exo_p2p.types.runner import RunnerStatus
from exo_p2p.types.tasks import TaskRecord
from exo_p2p.types.topology import LinkFigures, NodeProfile, TopologyEdge


class RunnerRecord(msgspec.Struct, frozen=True):
    """A runner as State holds it: which instance and node, and its last status."""

    runner_id: RunnerId
    instance_id: InstanceId
    node_id: NodeId
    status: RunnerStatus


class State(msgspec.Struct, frozen=True):
    """The cluster's replicated state after applying events ``1..last_event_idx``.

    Holds no node-local or wall-clock fields, so every node that applied the same events has
    the same ``state_hash`` (docs/architecture.md#log-guarantees). ``edges[source][sink]`` is the edge source→sink.
    Finished generation tasks are removed, so State does not grow with traffic.

    ``origin_seqs[origin][origin_boot]`` is the highest ``origin_seq`` indexed from that
    origin and boot (``master.sequencer``): the master's de-duplication table, kept in State
    so a snapshot (and its hash) carries it and a master rebuilt from snapshot + tail
    de-duplicates exactly like one rebuilt from the whole log. One entry per node boot (and
    per origin epoch after a replaced log): it grows with restarts, never with traffic.
    ``prefixes`` holds at most ``exo_p2p.content.prefixes.MAX_DIGESTS`` digests per instance.

    ``hub_models`` names the model hub source of each model read from a hub
    (``HubModelResolved``), and ``hub_resolved`` the log index of its last resolution: at most
    ``exo_p2p.state.hub_cards.MAX_HUB_MODELS``, forgotten once unused (``HubModelsForgotten``).
    """

    nodes: dict[NodeId, NodeProfile] = msgspec.field(default_factory=dict)
    edges: dict[NodeId, dict[NodeId, TopologyEdge]] = msgspec.field(default_factory=dict)
    model_cards: dict[ModelId, ModelCard] = msgspec.field(default_factory=dict)
    instances: dict[InstanceId, Instance] = msgspec.field(default_factory=dict)
    runners: dict[RunnerId, RunnerRecord] = msgspec.field(default_factory=dict)
    tasks: dict[TaskId, TaskRecord] = msgspec.field(default_factory=dict)
    master: NodeId | None = None
    term: int = 0
    last_event_idx: int = 0
    origin_seqs: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)
    prefixes: dict[InstanceId, tuple[int, ...]] = msgspec.field(default_factory=dict)
    """Per instance, the digests of the prefixes its prompt cache holds (``InstancePrefixesUpdated``)."""
    hub_models: dict[ModelId, HubSource] = msgspec.field(default_factory=dict)
    hub_resolved: dict[ModelId, int] = msgspec.field(default_factory=dict)
    links: dict[NodeId, dict[NodeId, dict[str, LinkFigures]]] = msgspec.field(default_factory=dict)
    """``links[source][sink][address]``: what source measured of each address of sink
    (``LinkMeasured``; at most ``exo_p2p.types.topology.MAX_ADDRESSES`` per pair, dropped with
    the pair's edge or either node)."""
    usage: dict[InstanceId, InstanceUsage] = msgspec.field(default_factory=dict)
    """Per instance, its last use and keep-alive (``InstanceUsed``; dropped with the instance,
    carried to the instance that replaces it): the deadline the master unloads idle
    instances by (``master.idle``). Its times are the master's wall clock, carried in events,
    so every node holds the same values."""
