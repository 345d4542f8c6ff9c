"""Requests move after a failure: the pure rules of ``exo_p2p.api.generation.resume`` and the
shared generation path (``exo_p2p.api.generation.path``) moving a request on a fake backend:
resumed from the tokens sent, one uninterrupted stream, bounded waits, limits, cancel."""

from __future__ import annotations

import json
from typing import Any

import httpx
import trio
from hypothesis import given
from hypothesis import strategies as st

from exo_p2p.api.generation.job import GenerationSettings
from exo_p2p.api.generation.resume import (
    MOVABLE_CODE,
    GiveUp,
    Move,
    Retry,
    model_given_up,
    movable,
    on_failure,
    on_refusal,
)
from exo_p2p.types import CommandResult, ErrorChunk, ErrorInfo, State, SubmitTask
from tests.support.fake_master import MODEL, FakeMaster, chat_body, run_api, sse_events, submits
from tests.support.resume_scripts import FAILED, LOADING, WORDS, failing_script


# --------------------------------------------------------------------------- pure rules

statuses = st.sampled_from([400, 404, 409, 429, 500, 503, 504])
codes = st.sampled_from([None, MOVABLE_CODE, "loading", "instance_failed", "out_of_memory", "timeout"])
infos = st.builds(ErrorInfo, statuses, st.text(max_size=20), st.just("server_error"), st.none(), codes)


@given(infos, st.lists(st.integers(0, 50_000), max_size=40).map(tuple), st.integers(0, 5), st.integers(0, 5))
def test_only_serving_side_failures_move_and_at_most_max_moves_times(error, sent, moves, max_moves) -> None:
    decision = on_failure(error, sent, moves, max_moves)
    if error.status == 503 and error.code == MOVABLE_CODE and moves < max_moves:
        assert decision == Move(sent)
    else:
        assert isinstance(decision, GiveUp)
        # the error it would have had: same status and code, its message kept
        assert (decision.error.status, decision.error.code) == (error.status, error.code)
        assert decision.error.message.startswith(error.message)


@given(infos, st.floats(0, 200), st.floats(1, 120), st.booleans())
def test_a_refused_continuation_waits_only_within_the_bound_and_for_capacity(refusal, waited, bound, given_up) -> None:
    step = on_refusal(FAILED, refusal, waited=waited, bound=bound, given_up=given_up)
    waits = not given_up and refusal.status in (429, 503) and refusal.code != "out_of_memory" and waited + 0.5 <= bound
    assert isinstance(step, Retry) == waits
    if isinstance(step, GiveUp):
        assert step.error.status == 503 and step.error.message.startswith(FAILED.message)
        assert refusal.message in step.error.message


def test_movable_is_the_routers_failure_only() -> None:
    assert movable(FAILED)
    assert not movable(ErrorInfo(400, "prompt is 9000 tokens but the model's context is 8192 tokens"))
    assert not movable(ErrorInfo(504, "no output", code="timeout"))
    assert not movable(ErrorInfo(500, "generation failed: boom", code=MOVABLE_CODE))


def test_model_given_up_needs_every_instance_given_up() -> None:
    from tests.support.fake_master import card
    from exo_p2p.types import Instance

    def inst(i: str, gave_up: bool) -> Instance:
        return Instance(instance_id=i, model_id=MODEL, sharding="pipeline", shards=(), failed_reason="x", gave_up=gave_up)  # type: ignore[arg-type]

    state = State(model_cards={MODEL: card(MODEL)})
    assert not model_given_up(state, MODEL)
    state = State(model_cards={MODEL: card(MODEL)}, instances={"a": inst("a", True)})  # type: ignore[dict-item]
    assert model_given_up(state, MODEL)
    state = State(model_cards={MODEL: card(MODEL)}, instances={"a": inst("a", True), "b": inst("b", False)})  # type: ignore[dict-item]
    assert not model_given_up(state, MODEL)


# --------------------------------------------------------------------------- the loop


class RefusingMaster(FakeMaster):
    """Refuses the continuations (every submission after the first) with ``refusals`` in
    turn, then accepts."""

    refusals: list[ErrorInfo] = []

    async def command(self, command: Any, timeout: float = 30.0) -> CommandResult:
        if isinstance(command, SubmitTask) and submits(self) and self.refusals:
            self.commands.append(command)
            return CommandResult(command.command_id, error=self.refusals.pop(0))
        return await super().command(command, timeout)


def run_refusing(body: Any, refusals: list[ErrorInfo], *, timeout: float = 20.0, **app_kwargs: Any) -> None:
    """``tests.support.fake_master.run_api`` with a ``RefusingMaster`` refusing ``refusals`` first."""
    from exo_p2p.api import create_app

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            backend = RefusingMaster(nursery)
            backend.refusals = list(refusals)
            transport = httpx.ASGITransport(app=create_app(backend, **app_kwargs))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                with trio.fail_after(timeout):
                    await body(client, backend)
            nursery.cancel_scope.cancel()

    trio.run(main)


def _without_keepalives(text: str) -> str:
    return "".join(e + "\n\n" for e in text[:-2].split("\n\n") if not e.startswith(":"))


def _stream_text(r: httpx.Response) -> tuple[str, dict]:
    events = [e for e in sse_events(_without_keepalives(r.text)) if e != "[DONE]"]
    chunks = [json.loads(e) for e in events]
    assert all("error" not in c for c in chunks), chunks
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    usage = [c["usage"] for c in chunks if c.get("usage")]
    return text, usage[-1] if usage else {}


def test_a_stream_moves_twice_and_reads_as_one_uninterrupted_answer() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        backend.script, calls = failing_script({0: 2, 1: 3})
        r = await client.post("/v1/chat/completions", json=chat_body(stream=True, stream_options={"include_usage": True}))
        assert r.status_code == 200
        text, usage = _stream_text(r)
        assert text == "".join(WORDS)
        assert usage["completion_tokens"] == len(WORDS) and usage["prompt_tokens"] == 12
        assert [len(c.params.resume_tokens) for c in calls] == [0, 2, 5]
        state = (await client.get("/state")).json()
        assert state["counters"]["requests_moved"] == 2 and state["counters"]["requests_move_failed"] == 0

    run_api(body)


def test_a_non_streamed_request_moves_and_completes() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        backend.script, calls = failing_script({0: 0})
        r = await client.post("/v1/chat/completions", json=chat_body())
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "".join(WORDS)
        assert [len(c.params.resume_tokens) for c in calls] == [0, 0]

    run_api(body)


def test_a_third_failure_is_answered_with_the_error_it_would_have_had() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        backend.script, calls = failing_script({0: 1, 1: 1, 2: 1})
        r = await client.post("/v1/chat/completions", json=chat_body(stream=True))
        events = [json.loads(e) for e in sse_events(_without_keepalives(r.text)) if e != "[DONE]"]
        assert "error" in events[-1] and FAILED.message in events[-1]["error"]["message"]
        assert len(calls) == 3  # moved twice (the default), not a third time
        assert (await client.get("/state")).json()["counters"]["requests_move_failed"] == 1

    run_api(body)


def test_a_move_waits_for_a_loading_instance_with_keepalives() -> None:
    async def main(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        backend.script, calls = failing_script({0: 3})
        r = await client.post("/v1/chat/completions", json=chat_body(stream=True))
        assert r.text.count(": keep-alive") >= 2, r.text  # 3 s of waiting, 1 s keep-alive interval
        text, _ = _stream_text(r)
        assert text == "".join(WORDS)
        assert len(submits(backend)) == 1 + 6 + 1

    # 3 s of refusals at the 0.5 s retry interval
    run_refusing(main, [LOADING] * 6, generation=GenerationSettings(keepalive_interval=1.0))


def test_no_capacity_within_the_bound_ends_with_the_failure() -> None:
    async def main(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        backend.script, calls = failing_script({0: 0})
        t0 = trio.current_time()
        r = await client.post("/v1/chat/completions", json=chat_body())
        assert 2.0 - 0.6 <= trio.current_time() - t0 <= 2.0 + 1.0
        assert r.status_code == 503
        message = r.json()["error"]["message"]
        assert FAILED.message in message and "could not move within 2 s" in message

    run_refusing(main, [LOADING] * 100, generation=GenerationSettings(move_bound=2.0))


def test_a_given_up_model_ends_the_move_at_once() -> None:
    async def main(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        backend.script, calls = failing_script({0: 1})
        gone = ErrorInfo(404, "The model `x` does not exist in this cluster", "not_found_error", code="model_not_found")
        backend.refusals = [gone]
        t0 = trio.current_time()
        r = await client.post("/v1/chat/completions", json=chat_body(stream=True))
        assert trio.current_time() - t0 < 1.0
        events = [json.loads(e) for e in sse_events(_without_keepalives(r.text)) if e != "[DONE]"]
        assert FAILED.message in events[-1]["error"]["message"] and "could not move" in events[-1]["error"]["message"]

    run_refusing(main, [])


def test_a_disconnect_during_a_move_cancels_the_continuation() -> None:
    """The continuation is accepted but sends nothing yet (a re-placed instance's prefill
    queue): the client leaves; its current task — the continuation — is cancelled."""
    import msgspec

    from exo_p2p.api import create_app
    from exo_p2p.types import CancelGeneration
    from tests.support.fake_master import drive_asgi

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            backend = FakeMaster(nursery)
            inner, calls = failing_script({0: 2})
            backend.script = lambda cmd: [30.0, *inner(cmd)] if calls else inner(cmd)
            app = create_app(backend)
            payload = msgspec.json.encode(chat_body(stream=True))
            with trio.fail_after(10):
                await drive_asgi(app, payload, lambda sent: len(calls) == 2)
            cancels = [c.task_id for c in backend.commands if isinstance(c, CancelGeneration)]
            assert cancels[-1] == calls[1].task_id, (cancels, [c.task_id for c in calls])
            assert not backend.channels  # every route closed
            nursery.cancel_scope.cancel()

    trio.run(main)


def _anthropic_text(raw: str) -> str:
    out = []
    for line in raw.splitlines():
        if line.startswith("data: "):
            event = json.loads(line[6:])
            assert event.get("type") != "error", event
            if event.get("type") == "content_block_delta":
                out.append(event["delta"]["text"])
    return "".join(out)


def _ollama_text(raw: str) -> str:
    out = []
    for line in raw.splitlines():
        if line.strip():
            event = json.loads(line)
            assert "error" not in event, event
            out.append(event.get("message", {}).get("content", ""))
    return "".join(out)


def test_every_family_shares_the_move() -> None:
    """Anthropic Messages and Ollama chat streams read as one answer across two moves."""

    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        messages = [{"role": "user", "content": "hi"}]
        backend.script, calls = failing_script({0: 1, 1: 4})
        r = await client.post("/v1/messages", json={"model": MODEL, "max_tokens": 50, "messages": messages, "stream": True})
        assert r.status_code == 200 and _anthropic_text(r.text) == "".join(WORDS)
        backend.script, calls = failing_script({0: 3, 1: 2})
        r = await client.post("/api/chat", json={"model": MODEL, "messages": messages, "stream": True})
        assert r.status_code == 200 and _ollama_text(r.text) == "".join(WORDS)
        assert [len(c.params.resume_tokens) for c in calls] == [0, 3, 5]

    run_api(body)


def test_resumed_tokens_count_in_the_prompt_bound_of_admission() -> None:
    from exo_p2p.types import ChatMessage, GenerationParams
    from master.admission import prompt_token_bound

    params = GenerationParams(messages=(ChatMessage(role="user", content="hi"),))
    resumed = GenerationParams(messages=params.messages, resume_tokens=tuple(range(300)))
    assert prompt_token_bound(resumed, 8192) == prompt_token_bound(params, 8192) + 300
    assert prompt_token_bound(resumed, 100) == 100


def test_max_moves_is_a_node_setting() -> None:
    from typer.testing import CliRunner

    from exo_p2p.cli.main import app
    from exo_p2p.cli.cluster.node_config import build_node_config

    assert build_node_config().max_moves == 2
    assert build_node_config(max_moves=0).max_moves == 0
    result = CliRunner().invoke(app, ["node", "--max-moves", "-1"])
    assert result.exit_code != 0 and "max-moves" in result.output


RUNNER_500 = ErrorInfo(500, "generation failed: RuntimeError('[ring] connection to a peer was lost')", "server_error")


def _runner_error_script(fail_after: int):
    inner, calls = failing_script({0: fail_after})

    def script(cmd: SubmitTask) -> list:
        out = inner(cmd)
        if len(calls) == 1:  # the first task ends with the runner's own 500 instead
            out[-1] = ErrorChunk(task_id=cmd.task_id, error=RUNNER_500)
        return out

    return script, calls


def test_a_runner_error_moves_when_its_instance_fails() -> None:
    """FakeMaster's instance ``inst-1`` is not in its State: it counts as failed."""

    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        backend.script, calls = _runner_error_script(2)
        r = await client.post("/v1/chat/completions", json=chat_body(stream=True))
        text, _ = _stream_text(r)
        assert text == "".join(WORDS) and [len(c.params.resume_tokens) for c in calls] == [0, 2]

    run_api(body, generation=GenerationSettings(fail_wait=1.0))


def test_a_runner_error_on_a_healthy_instance_is_the_models_own() -> None:
    from exo_p2p.api import create_app

    class HealthyInstance(FakeMaster):
        def state(self) -> State:
            from exo_p2p.types import Instance

            inst = Instance(instance_id="inst-1", model_id=MODEL, sharding="pipeline", shards=())  # type: ignore[arg-type]
            return msgspec_replace(super().state(), instances={"inst-1": inst})

    import msgspec

    msgspec_replace = msgspec.structs.replace

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            backend = HealthyInstance(nursery)
            backend.script, calls = _runner_error_script(0)
            transport = httpx.ASGITransport(app=create_app(backend, generation=GenerationSettings(fail_wait=1.0)))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                with trio.fail_after(10):
                    t0 = trio.current_time()
                    r = await client.post("/v1/chat/completions", json=chat_body())
                    assert 0.9 <= trio.current_time() - t0 < 3.0
            assert r.status_code == 500 and r.json()["error"]["message"] == RUNNER_500.message
            assert len(calls) == 1
            nursery.cancel_scope.cancel()

    trio.run(main)
