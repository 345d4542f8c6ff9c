"""Which local events a node may report (pure; docs/architecture.md#wire-and-storage).

A node reports facts about itself only: its profile, the models it holds or read from a hub,
its own edges and the figures it measured of them, its own runners, the status of tasks of instances it serves, and the prefix
digests of instances whose rank 0 it hosts. Every other kind of event
is the master's to make. ``refuse_local`` says why an event is refused, or None. The master
records the sequence number of a refused event anyway, so the origin's later events are not
stuck behind a gap.
"""

from __future__ import annotations

from exo_p2p.state.hub_cards import card_too_large
from exo_p2p.types import (
    Event,
    HubModelResolved,
    InstancePrefixesUpdated,
    LinkLost,
    LinkMeasured,
    NodeModelsUpdated,
    NodeProfileUpdated,
    RunnerStatusUpdated,
    State,
    TaskStatusUpdated,
    TopologyEdgeCreated,
    TopologyEdgesCreated,
    TopologyEdgeDeleted,
)
from exo_p2p.types.events import MAX_EDGES_PER_EVENT
from exo_p2p.types.topology import MAX_ALIAS_CHARS, MAX_ALIASES


def refuse_local(state: State, origin: str, event: Event) -> str | None:
    """None when ``origin`` may report ``event``, else the reason it is refused."""
    if isinstance(event, NodeProfileUpdated):
        aliases = event.profile.aliases  # bounded: exo_p2p.types.topology.MAX_ALIASES
        if len(aliases) > MAX_ALIASES or any(len(a) > MAX_ALIAS_CHARS for a in aliases):
            return f"profile with more than {MAX_ALIASES} aliases or one over {MAX_ALIAS_CHARS} characters"
        return None if event.profile.node_id == origin else "profile of another node"
    if isinstance(event, NodeModelsUpdated):
        return None if event.node_id == origin else "models of another node"
    if isinstance(event, HubModelResolved):  # what this node read from a hub, its card bounded
        return card_too_large(event.card) if event.node_id == origin else "hub model read by another node"
    if isinstance(event, TopologyEdgeCreated):
        return None if event.edge.source == origin else "edge from another node"
    if isinstance(event, TopologyEdgesCreated):
        if len(event.edges) > MAX_EDGES_PER_EVENT:
            return f"more than {MAX_EDGES_PER_EVENT} edges in one event"
        return None if all(e.source == origin for e in event.edges) else "edge from another node"
    if isinstance(event, TopologyEdgeDeleted):
        return None if event.source == origin else "edge from another node"
    if isinstance(event, (LinkMeasured, LinkLost)):  # what this node measured (docs/links.md)
        return None if event.source == origin else "link figures from another node"
    if isinstance(event, RunnerStatusUpdated):
        if event.node_id != origin:
            return "runner of another node"
        instance = state.instances.get(event.instance_id)
        if instance is not None and not any(s.runner_id == event.runner_id and s.node_id == origin for s in instance.shards):
            return "runner not placed on this node"
        return None
    if isinstance(event, InstancePrefixesUpdated):
        instance = state.instances.get(event.instance_id)
        if instance is not None and (not instance.shards or instance.shards[0].node_id != origin):
            return "prefixes of an instance whose rank 0 is not on this node"
        return None
    if isinstance(event, TaskStatusUpdated):
        record = state.tasks.get(event.task_id)
        if record is None:
            return None
        instance = state.instances.get(record.task.instance_id)
        if instance is not None and not any(s.node_id == origin for s in instance.shards):
            return "task of an instance this node does not serve"
        return None
    return f"{type(event).__name__} is the master's to make"
