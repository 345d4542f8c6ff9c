"""The gauges and counters a scrape reads from the node as it is (``NodeCollector``).

Per node: whether it is master, the term and the log index it applied, term changes and its
runners' starts and failures seen in the log, its API's requests in flight and moved, its
message counters (those of ``GET /state``), the bytes of its State against their budget
(``exo_p2p.state.budget``) and model bytes received by source. Per runner of
this node (labels instance, model, rank): queue, batch rows and limit, KV bytes in use and
budget, prompt-cache bytes, bound, hits, misses and reused tokens (``EngineStats``). The
master's view of the cluster (nodes, instances by status, unfinished tasks and load per
instance) only while this node is master, so a sum over every node's scrape counts the
cluster once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exo_p2p.state import instance_view
from exo_p2p.state.budget import STATE_BUDGET_BYTES, state_bytes
from exo_p2p.types import (FINISHED_TASK_STATUSES, Event, InstanceDeleted, MasterElected, RunnerFailed, RunnerIdle,
                           RunnerStatusUpdated, State)
from exo_p2p.types.observe import EngineStats


UNLOAD_REASONS = ("idle", "request", "room")
"""``InstanceDeleted.reason`` values counted (``master.idle``, ``master.handover``)."""
PLACEMENT_OUTCOMES = ("placed", "reused", "failed")
"""Outcomes of a placement on demand (``exo_p2p.api.demand.placer.DemandPlacer.outcomes``)."""


@dataclass(frozen=True)
class RunnerFigures:
    """One runner of this node as a scrape sees it: its labels and its last ``EngineStats``."""

    instance: str
    model: str
    rank: int
    stats: EngineStats


@dataclass
class NodeCounts:
    """What the node counts from the log it applies (mutated by ``count_event``)."""

    term_changes: int = 0
    runners_started: int = 0
    runner_failures: int = 0
    transfer_bytes: dict[str, int] = field(default_factory=dict)
    """Model bytes received, by source (a peer's node id, or ``huggingface``)."""
    unloads: dict[str, int] = field(default_factory=lambda: dict.fromkeys(UNLOAD_REASONS, 0))
    """Instances the master unloaded on its own, by ``InstanceDeleted.reason``."""


def count_event(counts: NodeCounts, event: Event, node_id: str) -> None:
    """Count ``event`` (one the node applied): a master elected, a runner of ``node_id``
    started (idle) or failed, an instance unloaded by the master (by reason, whichever node
    was master: every node counts it from the log, so a new master's term goes on counting)."""
    if isinstance(event, MasterElected):
        counts.term_changes += 1
    elif isinstance(event, InstanceDeleted) and event.reason in UNLOAD_REASONS:
        counts.unloads[event.reason] += 1
    elif isinstance(event, RunnerStatusUpdated) and event.node_id == node_id:
        if isinstance(event.status, RunnerIdle):
            counts.runners_started += 1
        elif isinstance(event.status, RunnerFailed):
            counts.runner_failures += 1


@dataclass
class MetricSources:
    """Zero-argument readers of the node, called at each scrape."""

    state: Callable[[], State]
    node_id: str
    is_master: Callable[[], bool] = lambda: False
    runners: Callable[[], list[RunnerFigures]] = lambda: []
    counters: Callable[[], dict[str, int]] = lambda: {}
    in_flight: Callable[[], int] = lambda: 0
    moves: Callable[[], tuple[int, int]] = lambda: (0, 0)
    """(requests moved, moves that failed)."""
    placements: Callable[[], dict[str, int]] = lambda: {}
    """This node's API's placements on demand by outcome (``PLACEMENT_OUTCOMES``)."""
    counts: NodeCounts = field(default_factory=NodeCounts)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _labelled(name: str, doc: str, label: str, values: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


class NodeCollector(Collector):
    """A prometheus collector over ``MetricSources`` (module docstring)."""

    def __init__(self, sources: MetricSources) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        s = self.sources
        state = s.state()
        yield _gauge("exo_is_master", "1 when this node is the master", 1.0 if s.is_master() else 0.0)
        yield _gauge("exo_term", "The master's term in the log this node applied", state.term)
        yield _gauge("exo_log_index", "Index of the last event this node applied", state.last_event_idx)
        yield _gauge("exo_state_bytes", "Bytes of the replicated State this node holds (canonical msgpack)", state_bytes(state))
        yield _gauge("exo_state_budget_bytes", "Bytes State may take (exo_p2p.state.budget)", STATE_BUDGET_BYTES)
        yield _gauge("exo_state_hub_models", "Models read from a hub that State holds cards of", len(state.hub_models))
        yield _counter("exo_term_changes", "Masters elected in the log this node applied", s.counts.term_changes)
        yield _counter("exo_runners_started", "Runners of this node started (idle reported)", s.counts.runners_started)
        yield _counter("exo_runner_failures", "Runners of this node that failed", s.counts.runner_failures)
        yield _gauge("exo_requests_in_flight", "Generations this node's API is serving", s.in_flight())
        moved, failed = s.moves()
        yield _counter("exo_requests_moved", "Requests moved to another instance after a failure", moved)
        yield _counter("exo_requests_move_failed", "Requests that could not move after a failure", failed)
        messages = GaugeMetricFamily("exo_node_counter", "This node's message counters (GET /state)", labels=["counter"])
        for name, value in sorted(s.counters().items()):
            messages.add_metric([name], value)
        yield messages
        yield _labelled("exo_placements_on_demand", "Placements on demand this node's API sent, by outcome "
                        "(placed: a new instance; reused: the master answered with one loading or ready; failed: refused)",
                        "outcome", {k: s.placements().get(k, 0) for k in PLACEMENT_OUTCOMES})
        yield _labelled("exo_instance_unloads", "Instances the master unloaded on its own, by reason (idle: keep-alive ran "
                        "out; request: keep_alive 0; room: handed over to a placement), counted from the log this node "
                        "applied", "reason", s.counts.unloads)
        transfer = CounterMetricFamily("exo_model_transfer_bytes", "Model bytes received, by source", labels=["source"])
        for source, value in sorted(s.counts.transfer_bytes.items()):
            transfer.add_metric([source], value)
        yield transfer
        yield from _runner_metrics(s.runners())
        if s.is_master():
            yield from _cluster_metrics(state)


_RUNNER_GAUGES = (
    ("exo_runner_queue_length", "Requests waiting for a batch row", lambda st: st.queued),
    ("exo_runner_batch_rows", "Sequences being served (prefilling or decoding)", lambda st: st.batch_rows),
    ("exo_runner_batch_limit", "Sequences the batch may hold (--max-batch)", lambda st: st.batch_limit),
    ("exo_runner_kv_bytes", "Bytes of KV the batch holds", lambda st: st.kv_tokens * st.kv_bytes_per_token),
    ("exo_runner_kv_budget_bytes", "Bytes of KV the batch may hold (0: unchecked)",
     lambda st: (st.kv_capacity_tokens or 0) * st.kv_bytes_per_token),
    ("exo_prompt_cache_bytes", "Bytes of KV the prompt cache holds", lambda st: st.cache_tokens * st.kv_bytes_per_token),
    ("exo_prompt_cache_bound_bytes", "Bytes of KV the prompt cache may hold (0: off)",
     lambda st: st.cache_bound_tokens * st.kv_bytes_per_token),
    ("exo_prompt_cache_disk_bytes", "Bytes of KV blocks the prompt cache's disk tier holds", lambda st: st.cache_disk_bytes),
    ("exo_prompt_cache_disk_writable", "1 while the disk tier writes, 0 once a write failed (disk full)",
     lambda st: int(st.cache_disk_writable)),
)
_RUNNER_COUNTERS = (
    ("exo_prompt_cache_hits", "Requests that reused a cached prefix", lambda st: st.cache_hits_total),
    ("exo_prompt_cache_misses", "Requests that found no cached prefix", lambda st: st.cache_misses_total),
    ("exo_prompt_cache_reused_tokens", "Prompt tokens reused from the prompt cache", lambda st: st.reused_tokens_total),
    ("exo_prompt_cache_disk_hits", "Requests whose cached prefix was read back from disk", lambda st: st.cache_disk_hits_total),
    ("exo_prompt_cache_restored_tokens", "Prompt tokens reused from blocks read back from disk",
     lambda st: st.cache_restored_tokens_total),
    ("exo_prompt_cache_disk_rejected", "Disk-tier blocks deleted for failing a check", lambda st: st.cache_disk_rejected_total),
    ("exo_runner_prefilled_tokens", "Prompt tokens fed through the model", lambda st: st.prefilled_tokens_total),
    ("exo_runner_generated_tokens", "Tokens sampled for requests", lambda st: st.generated_tokens_total),
    ("exo_runner_draft_proposed_tokens", "Drafted tokens verified (speculative decoding)", lambda st: st.draft_proposed_total),
    ("exo_runner_draft_accepted_tokens", "Drafted tokens accepted (speculative decoding)", lambda st: st.draft_accepted_total),
)


def _runner_metrics(runners: list[RunnerFigures]) -> Iterator[Metric]:
    labels = ["instance", "model", "rank"]
    for name, doc, read in _RUNNER_GAUGES:
        family = GaugeMetricFamily(name, doc, labels=labels)
        for r in runners:
            family.add_metric([r.instance, r.model, str(r.rank)], read(r.stats))
        yield family
    for name, doc, read in _RUNNER_COUNTERS:
        counter = CounterMetricFamily(name, doc, labels=labels)
        for r in runners:
            counter.add_metric([r.instance, r.model, str(r.rank)], read(r.stats))
        yield counter


def _cluster_metrics(state: State) -> Iterator[Metric]:
    yield _gauge("exo_cluster_nodes", "Nodes in the cluster's State (master only)", len(state.nodes))
    by_status = GaugeMetricFamily("exo_cluster_instances", "Instances by status (master only)", labels=["status"])
    counts = {"loading": 0, "ready": 0, "failed": 0}
    for inst in state.instances.values():
        status = instance_view(state, inst).status
        counts[status] = counts.get(status, 0) + 1
    for status, n in sorted(counts.items()):
        by_status.add_metric([status], n)
    yield by_status
    tasks = GaugeMetricFamily("exo_cluster_tasks", "Unfinished tasks per instance (master only)",
                              labels=["instance", "model"])
    loads = GaugeMetricFamily("exo_cluster_instance_load", "Unfinished tasks ÷ batch limit, the master's load "
                              "(master only)",
                              labels=["instance", "model"])
    for iid, inst in sorted(state.instances.items()):
        n = sum(1 for t in state.tasks.values() if t.task.instance_id == iid and t.status not in FINISHED_TASK_STATUSES)
        tasks.add_metric([iid, inst.model_id], n)
        limit = inst.settings.max_batch if inst.settings is not None else 1
        loads.add_metric([iid, inst.model_id], n / max(1, limit))
    yield tasks
    yield loads
