"""The negative cache of placement on demand (pure, trio's mock clock): a placement that does
not fit is answered from memory for ``NEGATIVE_TTL`` s; one refused only because instances
serving a request hold the room (``placement_busy``, ``master.handover.PlacementBusy``) is a
503 with ``Retry-After`` that is not remembered, and places once they are idle
(docs/models.md "Placement on demand and idle unload")."""

from __future__ import annotations

import msgspec
import trio
import trio.testing

from exo_p2p.api.demand.placer import NEGATIVE_TTL, DemandPlacer
from exo_p2p.api.errors import error_headers
from exo_p2p.types import (ChatMessage, ErrorInfo, FinishGeneration, GenerationParams, NodeModelsUpdated, PlaceInstance, State, SubmitTask,
                           TaskCreated)
from master.commands import handle_command
from tests.support.rules.demand_master import T0, DemandMaster, no_tick, ready
from tests.support.rules.master_run import one_node, run
from tests.support.rules.strategies import CARD

BUSY = ErrorInfo(400, "needs 1 GiB (it fits once the 1 instance(s) serving a request are idle: a; retry then)",
                 "invalid_request_error", code="placement_busy")
NO_FIT = ErrorInfo(400, "needs 512 GiB; the largest candidate cycle has 96 GiB", "invalid_request_error", code="placement_failed")


def _run(body) -> None:  # type: ignore[no-untyped-def]
    trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_refusal_that_does_not_fit_is_remembered_for_the_negative_ttl():
    async def main() -> None:
        placer, master = DemandPlacer(), DemandMaster(one_node(), NO_FIT)
        first = await placer.ready(master, "m", None, no_tick)
        assert first is not None and first.status == 503 and first.code == "placement_failed" and "96 GiB" in first.message
        assert await placer.ready(master, "m", None, no_tick) == first and master.sent == 1  # from memory
        await trio.sleep(NEGATIVE_TTL + 0.1)
        assert (await placer.ready(master, "m", None, no_tick)) == first and master.sent == 2  # tried again

    _run(main)


def test_a_refusal_while_instances_serve_is_a_503_to_retry_and_is_not_remembered():
    async def main() -> None:
        placer, master = DemandPlacer(), DemandMaster(one_node(), BUSY)
        first = await placer.ready(master, "m", None, no_tick)
        assert first is not None and first.status == 503 and first.code == "placement_busy"
        assert "while other models serve requests" in first.message and "serving a request are idle: a" in first.message
        assert error_headers(first) == {"retry-after": "5"}
        assert "m" not in placer.failed
        assert await placer.ready(master, "m", None, no_tick) == first and master.sent == 2  # asked again at once
        master.refuse = None  # the request on "a" ended: the next request places it
        assert await placer.ready(master, "m", None, no_tick) is None and master.sent == 3

    _run(main)


def test_requests_waiting_on_this_nodes_placement_get_its_busy_answer_without_sending_another():
    async def main() -> None:
        placer, master = DemandPlacer(), DemandMaster(one_node(), BUSY, delay=1.0)
        answers: list = []

        async def ask() -> None:
            answers.append(await placer.ready(master, "m", None, no_tick))

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(ask)
        assert master.sent == 1 and len(answers) == 4 and all(a is not None and a.code == "placement_busy" for a in answers)

    _run(main)


def test_the_master_says_busy_only_when_the_placement_fits_once_serving_instances_are_idle():
    s = one_node(total=1500, available=1500)  # room for one 1000-byte model
    s = run(s, [NodeModelsUpdated("node-a", (CARD, msgspec.structs.replace(CARD, model_id="n")))])
    d = handle_command(s, PlaceInstance("a", "m", on_demand=True, keep_alive=300.0), now=T0)
    s = ready(run(s, d.events), d.result.instance)
    task = SubmitTask.generation("t1", "t1", "m", GenerationParams((ChatMessage("user", "hi"),), max_tokens=5), "node-a").task
    s = run(s, [TaskCreated(msgspec.structs.replace(task, instance_id="a"))])  # a request runs on "a"
    busy = handle_command(s, PlaceInstance("b", "n", on_demand=True, keep_alive=300.0), now=T0 + 2)
    assert busy.result.error.code == "placement_busy" and busy.events == ()
    huge = msgspec.structs.replace(CARD, model_id="huge", storage_size=10**6, layer_bytes=tuple(10**6 // CARD.n_layers for _ in CARD.layer_bytes))
    with_huge: State = run(s, [NodeModelsUpdated("node-a", (CARD, msgspec.structs.replace(CARD, model_id="n"), huge))])
    never = handle_command(with_huge, PlaceInstance("h", "huge", on_demand=True), now=T0 + 2)
    assert never.result.error.code == "placement_failed"  # does not fit even with "a" gone: a real refusal
    s = run(s, handle_command(s, FinishGeneration("f", "t1"), now=T0 + 3).events)  # the request ended
    placed = handle_command(s, PlaceInstance("b", "n", on_demand=True, keep_alive=300.0), now=T0 + 4)
    assert placed.result.error is None and [type(e).__name__ for e in placed.events][:2] == ["InstanceDeleted", "InstanceCreated"]
