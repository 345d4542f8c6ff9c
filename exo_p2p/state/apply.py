"""``apply(State, IndexedEvent) -> State``: the one pure rule by which every node builds the
replicated State (docs/architecture.md#request-flow). Deterministic, no I/O, no clocks; the input State is
never mutated (a new State is returned)."""

from __future__ import annotations

from functools import singledispatch

import msgspec

from exo_p2p.types import (
    Event,
    HubModelResolved,
    HubModelsForgotten,
    IndexedEvent,
    InstanceCreated,
    InstanceUsed,
    InstanceDeleted,
    InstanceFailed,
    InstancePrefixesUpdated,
    LinkLost,
    LinkMeasured,
    MasterElected,
    NodeModelsUpdated,
    NodeProfileUpdated,
    NodeTimedOut,
    RunnerDeleted,
    RunnerReady,
    RunnerRecord,
    RunnerRunning,
    RunnerStatusUpdated,
    State,
    TaskCancelRequested,
    TaskCreated,
    TaskDeleted,
    TaskRecord,
    TaskStatusUpdated,
    TopologyEdgeCreated, TopologyEdgesCreated,
    TopologyEdgeDeleted,
)

from exo_p2p.types.topology import MAX_ADDRESSES
from exo_p2p.state import hub_cards, usage
from exo_p2p.content.prefixes import bounded

replace = msgspec.structs.replace


class EventOrderError(ValueError):
    """An indexed event was applied out of order (its idx is not ``last_event_idx + 1``)."""


def apply(state: State, indexed: IndexedEvent) -> State:
    """Apply one indexed event, returning the new State.

    Raises ``EventOrderError`` unless ``indexed.idx == state.last_event_idx + 1`` (callers
    buffer out-of-order events and drop duplicates before calling). Events that refer to
    unknown ids (a runner of a deleted instance, a task already removed) change nothing but
    the index: late facts about things that are gone are harmless.
    """
    if indexed.idx != state.last_event_idx + 1:
        raise EventOrderError(f"event idx {indexed.idx} applied after {state.last_event_idx}")
    new = _apply_event(indexed.event, state)
    if indexed.origin:
        new = replace(new, origin_seqs=record_origin(new.origin_seqs, indexed))
    return replace(new, last_event_idx=indexed.idx, term=max(new.term, indexed.term))


def record_origin(origin_seqs: dict[str, dict[str, int]], indexed: IndexedEvent) -> dict[str, dict[str, int]]:
    """``origin_seqs`` (``State.origin_seqs``) with ``indexed``'s origin sequence number
    recorded: the highest seen per (origin, origin_boot). A new dict; the input is unchanged."""
    boots = origin_seqs.get(indexed.origin, {})
    if boots.get(indexed.origin_boot, 0) >= indexed.origin_seq:
        return origin_seqs
    out = dict(origin_seqs)
    out[indexed.origin] = {**boots, indexed.origin_boot: indexed.origin_seq}
    return out


@singledispatch
def _apply_event(event: Event, state: State) -> State:
    raise TypeError(f"no rule for event {type(event).__name__}")


@_apply_event.register
def _apply_node_profile_updated(event: NodeProfileUpdated, state: State) -> State:
    nodes = dict(state.nodes)
    nodes[event.profile.node_id] = event.profile
    return replace(state, nodes=nodes)


@_apply_event.register
def _apply_node_models_updated(event: NodeModelsUpdated, state: State) -> State:
    cards = dict(state.model_cards)
    for card in event.cards:
        cards[card.model_id] = card
    nodes = dict(state.nodes)
    profile = nodes.get(event.node_id)
    if profile is not None:
        nodes[event.node_id] = replace(profile, models=tuple(sorted(c.model_id for c in event.cards)))
    return replace(state, model_cards=cards, nodes=nodes)


@_apply_event.register
def _apply_hub_model_resolved(event: HubModelResolved, state: State) -> State:
    return hub_cards.admit(state, event, state.last_event_idx + 1)  # bounded: exo_p2p.state.hub_cards


@_apply_event.register
def _apply_hub_models_forgotten(event: HubModelsForgotten, state: State) -> State:
    return hub_cards.forget(state, event.model_ids)


@_apply_event.register
def _apply_node_timed_out(event: NodeTimedOut, state: State) -> State:
    nodes = {k: v for k, v in state.nodes.items() if k != event.node_id}
    edges = {
        src: {dst: e for dst, e in sinks.items() if dst != event.node_id}
        for src, sinks in state.edges.items()
        if src != event.node_id
    }
    edges = {src: sinks for src, sinks in edges.items() if sinks}
    master = None if state.master == event.node_id else state.master
    links = {
        src: {dst: figs for dst, figs in sinks.items() if dst != event.node_id}
        for src, sinks in state.links.items()
        if src != event.node_id
    }
    links = {src: sinks for src, sinks in links.items() if sinks}
    return replace(state, nodes=nodes, edges=edges, master=master, links=links)


@_apply_event.register
def _apply_topology_edge_created(event: TopologyEdgeCreated | TopologyEdgesCreated, state: State) -> State:
    edges = dict(state.edges)  # copied once for every edge of a TopologyEdgesCreated
    for edge in (event.edge,) if isinstance(event, TopologyEdgeCreated) else event.edges:
        if edges.get(edge.source) is state.edges.get(edge.source):
            edges[edge.source] = dict(state.edges.get(edge.source, {}))
        edges[edge.source][edge.sink] = edge
    return replace(state, edges=edges)


@_apply_event.register
def _apply_topology_edge_deleted(event: TopologyEdgeDeleted, state: State) -> State:
    if event.sink not in state.edges.get(event.source, {}):
        return state
    edges = dict(state.edges)
    sinks = {k: v for k, v in edges[event.source].items() if k != event.sink}
    if sinks:
        edges[event.source] = sinks
    else:
        del edges[event.source]
    return replace(state, edges=edges, links=_without_links(state.links, event.source, event.sink))


def _without_links(links: dict, source: str, sink: str, address: str | None = None) -> dict:
    """``links`` without source→sink's figures (of ``address`` only, when given)."""
    sinks = dict(links.get(source, {}))
    if sink not in sinks:
        return links
    figures = {a: f for a, f in sinks[sink].items() if address is not None and a != address}
    if figures:
        sinks[sink] = figures
    else:
        del sinks[sink]
    out = dict(links)
    if sinks:
        out[source] = sinks
    else:
        out.pop(source, None)
    return out


@_apply_event.register
def _apply_link_measured(event: LinkMeasured, state: State) -> State:
    """Figures of an address; ignored for unknown nodes, a self-link, or a pair that already
    holds ``MAX_ADDRESSES`` other addresses (bounded State)."""
    if event.source == event.sink or event.source not in state.nodes or event.sink not in state.nodes:
        return state
    sinks = dict(state.links.get(event.source, {}))
    figures = dict(sinks.get(event.sink, {}))
    address = event.figures.address
    if address not in figures and len(figures) >= MAX_ADDRESSES:
        return state
    figures[address] = event.figures
    sinks[event.sink] = figures
    links = dict(state.links)
    links[event.source] = sinks
    return replace(state, links=links)


@_apply_event.register
def _apply_link_lost(event: LinkLost, state: State) -> State:
    links = _without_links(state.links, event.source, event.sink, event.address)
    return state if links is state.links else replace(state, links=links)


@_apply_event.register
def _apply_master_elected(event: MasterElected, state: State) -> State:
    return replace(state, master=event.node_id, term=max(state.term, event.term))


@_apply_event.register
def _apply_instance_created(event: InstanceCreated, state: State) -> State:
    instances = dict(state.instances)
    instances[event.instance.instance_id] = event.instance
    return replace(state, instances=instances, usage=usage.created(state, event.instance))


@_apply_event.register
def _apply_instance_deleted(event: InstanceDeleted, state: State) -> State:
    if event.instance_id not in state.instances:
        return state
    instances = {k: v for k, v in state.instances.items() if k != event.instance_id}
    runners = {k: v for k, v in state.runners.items() if v.instance_id != event.instance_id}
    prefixes = {k: v for k, v in state.prefixes.items() if k != event.instance_id}
    return replace(state, instances=instances, runners=runners, prefixes=prefixes, usage=usage.deleted(state, event.instance_id))


@_apply_event.register
def _apply_instance_used(event: InstanceUsed, state: State) -> State:
    return usage.used(state, event)  # exo_p2p.state.usage


@_apply_event.register
def _apply_instance_prefixes(event: InstancePrefixesUpdated, state: State) -> State:
    if event.instance_id not in state.instances:
        return state
    prefixes = dict(state.prefixes)
    prefixes[event.instance_id] = bounded(event.digests)
    return replace(state, prefixes=prefixes)


@_apply_event.register
def _apply_instance_failed(event: InstanceFailed, state: State) -> State:
    instance = state.instances.get(event.instance_id)
    if instance is None or instance.gave_up or (instance.failed_reason is not None and not event.final):
        return state
    instances = dict(state.instances)
    instances[event.instance_id] = replace(instance, failed_reason=event.reason, gave_up=event.final)
    return replace(state, instances=instances)


@_apply_event.register
def _apply_runner_status_updated(event: RunnerStatusUpdated, state: State) -> State:
    if event.instance_id not in state.instances:
        return state
    runners = dict(state.runners)
    runners[event.runner_id] = RunnerRecord(
        runner_id=event.runner_id, instance_id=event.instance_id, node_id=event.node_id, status=event.status
    )
    instance = state.instances[event.instance_id]
    if not instance.served and isinstance(event.status, RunnerReady):
        records = [runners.get(s.runner_id) for s in instance.shards]
        if all(r is not None and isinstance(r.status, (RunnerReady, RunnerRunning)) for r in records):
            instances = dict(state.instances)
            instances[event.instance_id] = replace(instance, served=True)
            return replace(state, runners=runners, instances=instances)
    return replace(state, runners=runners)


@_apply_event.register
def _apply_runner_deleted(event: RunnerDeleted, state: State) -> State:
    if event.runner_id not in state.runners:
        return state
    return replace(state, runners={k: v for k, v in state.runners.items() if k != event.runner_id})


@_apply_event.register
def _apply_task_created(event: TaskCreated, state: State) -> State:
    tasks = dict(state.tasks)
    tasks[event.task.task_id] = TaskRecord(task=event.task)
    return replace(state, tasks=tasks)


@_apply_event.register
def _apply_task_status_updated(event: TaskStatusUpdated, state: State) -> State:
    record = state.tasks.get(event.task_id)
    if record is None or record.status in ("complete", "failed", "cancelled"):
        return state
    tasks = dict(state.tasks)
    tasks[event.task_id] = replace(record, status=event.status)
    return replace(state, tasks=tasks)


@_apply_event.register
def _apply_task_cancel_requested(event: TaskCancelRequested, state: State) -> State:
    record = state.tasks.get(event.task_id)
    if record is None or record.cancel_requested:
        return state
    tasks = dict(state.tasks)
    tasks[event.task_id] = replace(record, cancel_requested=True)
    return replace(state, tasks=tasks)


@_apply_event.register
def _apply_task_deleted(event: TaskDeleted, state: State) -> State:
    if event.task_id not in state.tasks:
        return state
    return replace(state, tasks={k: v for k, v in state.tasks.items() if k != event.task_id})
