"""Metrics of placement on demand and idle unload (pure, no processes): the reason the master
writes into ``InstanceDeleted`` (``master.idle``, ``master.handover``), every node counting
unloads by reason from the log it applies across master changes, and the API's placements on
demand by outcome (``exo_p2p.api.demand.placer``), as ``GET /metrics`` shows them
(docs/operations.md). The same against real nodes: ``tests/test_demand_nodes.py``."""

from __future__ import annotations

import msgspec
import trio

from exo_p2p.api.demand.placer import DemandPlacer
from exo_p2p.metrics.collect import MetricSources, NodeCounts, count_event
from exo_p2p.metrics.registry import NodeMetrics
from exo_p2p.types import (
    ChatMessage,
    ErrorInfo,
    FinishGeneration,
    GenerationParams,
    InstanceDeleted,
    MasterElected,
    NodeModelsUpdated,
    PlaceInstance,
    State,
    SubmitTask,
)
from master.commands import handle_command
from master.idle import IdleClock, idle_reason, unload_events
from tests.support.metrics_scrape import samples, value
from tests.support.rules.demand_master import T0, DemandMaster, no_tick, ready
from tests.support.rules.master_run import one_node, run
from tests.support.rules.strategies import CARD


def _on_demand(s: State, command_id: str, model: str, now: float, keep_alive: float = 300.0):  # type: ignore[no-untyped-def]
    d = handle_command(s, PlaceInstance(command_id, model, on_demand=True, keep_alive=keep_alive), now=now)
    assert d.result.error is None, d.result.error
    return d, ready(run(s, d.events), d.result.instance)


def test_the_master_says_why_it_unloads():
    s, a = one_node(), "a"
    _, s = _on_demand(s, a, "m", T0, keep_alive=2.0)
    assert idle_reason(s, a) == "idle"
    assert unload_events(s, a, idle_reason(s, a))[0] == InstanceDeleted(a, reason="idle")
    params = GenerationParams((ChatMessage("user", "hi"),), max_tokens=5)
    task = SubmitTask.generation("t1", "t1", "m", params, "node-a").task
    s = run(s, handle_command(s, SubmitTask("t1", task, keep_alive=0.0), now=T0 + 1).events)
    s = run(s, handle_command(s, FinishGeneration("f", "t1"), now=T0 + 2).events)
    assert IdleClock().due(s, T0 + 2) == (a,) and idle_reason(s, a) == "request"  # Ollama's keep_alive: 0
    assert unload_events(s, "by-hand")[0].reason is None  # DeleteInstance: not an unload the master chose

    room = run(one_node(total=1500, available=1500), [NodeModelsUpdated("node-a", (CARD, msgspec.structs.replace(CARD, model_id="n")))])
    _, room = _on_demand(room, "a", "m", T0)
    handed, _ = _on_demand(room, "b", "n", T0 + 10)
    assert handed.events[0] == InstanceDeleted("a", reason="room")


def test_every_node_counts_unloads_by_reason_from_the_log_across_masters():
    counts = NodeCounts()
    metrics = NodeMetrics(sources=MetricSources(state=State, node_id="n", counts=counts))
    log = [MasterElected("n", 1), InstanceDeleted("a", reason="idle"), InstanceDeleted("b", reason="room"),
           MasterElected("o", 2),  # a new master: the count goes on, it lives in the log, not in the master
           InstanceDeleted("c", reason="request"), InstanceDeleted("d", reason="idle"), InstanceDeleted("e"),
           InstanceDeleted("f", reason="made-up")]
    for event in log:
        count_event(counts, event, "n")
    text = metrics.exposition().decode()
    assert value(text, "exo_instance_unloads_total", reason="idle") == 2
    assert value(text, "exo_instance_unloads_total", reason="request") == 1
    assert value(text, "exo_instance_unloads_total", reason="room") == 1
    assert "made-up" not in text and value(text, "exo_term_changes_total") == 2
    fresh = NodeMetrics(sources=MetricSources(state=State, node_id="n", counts=NodeCounts())).exposition().decode()
    assert samples(fresh)[("exo_instance_unloads_total", (("reason", "room"),))] == 0  # every reason there from the start


def test_the_api_counts_its_placements_on_demand_by_outcome():
    placer = DemandPlacer()
    metrics = NodeMetrics(sources=MetricSources(state=State, node_id="n", placements=lambda: dict(placer.outcomes)))

    async def main() -> None:
        master = DemandMaster(one_node())
        assert await placer.ready(master, "m", None, no_tick) is None  # placed
        assert await placer.ready(master, "m", None, no_tick) is None and master.sent == 1  # ready: nothing sent
        lagging = DemandMaster(master.s)  # another node's API, its State behind: the master has "m" already
        lagging.state = lambda: master.s if lagging.sent else one_node()  # type: ignore[method-assign]
        other = DemandPlacer()
        assert await other.ready(lagging, "m", None, no_tick) is None
        assert other.outcomes == {"placed": 0, "reused": 1, "failed": 0}
        refusing = DemandMaster(one_node(), ErrorInfo(400, "no cycle fits", "invalid_request_error", code="placement_failed"))
        error = await placer.ready(refusing, "m", None, no_tick)
        assert error is not None and error.code == "placement_failed"

    trio.run(main)
    assert placer.outcomes == {"placed": 1, "reused": 0, "failed": 1} and placer.placed == 1
    text = metrics.exposition().decode()
    assert value(text, "exo_placements_on_demand_total", outcome="placed") == 1
    assert value(text, "exo_placements_on_demand_total", outcome="failed") == 1
    assert value(text, "exo_placements_on_demand_total", outcome="reused") == 0
