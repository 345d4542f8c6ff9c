"""The cluster-wide bound on request text in State (``master.in_flight``): a generation that
would bring all unfinished ones past the bound is refused with 429 ``cluster_busy``; ended
ones free their share."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from exo_p2p.types import ChatMessage, GenerationParams, SubmitTask, TaskStatusUpdated, ToolCall
from master import in_flight
from master.commands import handle_command
from master.in_flight import busy_refusal, in_flight_bytes, params_bytes
from tests.support.rules.strategies import CARD
from tests.support.rules.master_run import run
from tests.support.rules.submit_instances import two_ready_instances

KIB = 1024


def _params(text: str) -> GenerationParams:
    return GenerationParams((ChatMessage("user", text),), max_tokens=5)


def _submit(i: int, text: str) -> SubmitTask:
    return SubmitTask.generation(f"c{i}", f"t{i}", CARD.model_id, _params(text), "node-a")  # type: ignore[arg-type]


@given(st.lists(st.text(max_size=50), max_size=5), st.text(max_size=50), st.lists(st.text(max_size=20), max_size=4))
def test_params_bytes_counts_every_text_the_params_carry(contents, prompt, stops):
    messages = tuple(ChatMessage("user", c) for c in contents)
    p = GenerationParams(messages, prompt=prompt or None, stop=tuple(stops))
    expected = sum(len(c.encode()) for c in contents) + len(prompt.encode()) + sum(len(s.encode()) for s in stops)
    assert params_bytes(p) == expected
    call = ChatMessage("assistant", "", tool_calls=(ToolCall("id", "f", '{"a": "ü"}'),), reasoning="why")
    assert params_bytes(GenerationParams(messages + (call,), prompt=prompt or None, stop=tuple(stops))) == expected + len('{"a": "ü"}'.encode()) + 1 + 3


def test_the_bound_refuses_with_429_and_ended_generations_free_their_share(monkeypatch):
    monkeypatch.setattr(in_flight, "IN_FLIGHT_BYTES_LIMIT", 100 * KIB)
    s, _ = two_ready_instances()
    for i in range(3):  # 3 × 30 KiB in flight: within 100 KiB
        d = handle_command(s, _submit(i, "x" * 30 * KIB))
        assert d.result.error is None, d.result.error
        s = run(s, d.events)
    assert in_flight_bytes(s) == 90 * KIB
    refused = handle_command(s, _submit(9, "y" * 20 * KIB))
    assert refused.events == () and refused.result.error is not None
    assert (refused.result.error.status, refused.result.error.code) == (429, "cluster_busy")
    assert "90 KiB" in refused.result.error.message
    small = handle_command(s, _submit(10, "z" * 5 * KIB))
    assert small.result.error is None, "what still fits is admitted"
    s = run(s, small.events)
    s = run(s, [TaskStatusUpdated("t0", "complete")])  # an ended generation holds nothing
    assert in_flight_bytes(s) == 65 * KIB
    assert handle_command(s, _submit(9, "y" * 20 * KIB)).result.error is None


def test_an_empty_cluster_admits_any_single_request():
    s, _ = two_ready_instances()
    assert busy_refusal(s, _params("x" * 200), limit=10) is None
