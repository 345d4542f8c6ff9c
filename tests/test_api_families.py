"""Every API family with its official client (anthropic, ollama, openai) against the real
hypercorn server and the fake backend of ``tests.test_api``: request → ``GenerationParams``
mapping, answer shapes, streams, errors (before and after output), cancel on disconnect,
keep-alives during a long prefill, and ``GET /`` content negotiation.
"""

from __future__ import annotations

import json
from contextlib import aclosing
from typing import Any

import httpx
import pytest
import trio

from exo_p2p.api.access import AccessPolicy
from exo_p2p.api.generation.job import GenerationSettings
from exo_p2p.types import ErrorChunk, ErrorInfo, FinishChunk, PrefillProgressChunk, TokenChunk
from tests.support.fake_master import MODEL, TOKENS, UNPLACED, FakeMaster, reply_script, run_api, run_served, submits

anthropic = pytest.importorskip("anthropic")
ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")

TEXT = "".join(TOKENS)
QUESTION = "What is the capital of France?"
KEY = "sk-families-key"


def in_thread(fn):  # run a blocking client call off the trio loop
    return trio.to_thread.run_sync(fn)


def openai_client(url: str, **kw: Any):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=kw.pop("api_key", "unused"), max_retries=0, timeout=10, **kw)


def anthropic_client(url: str, **kw: Any):
    return anthropic.Anthropic(base_url=url, api_key=kw.pop("api_key", "unused"), max_retries=0, timeout=10, **kw)


# ------------------------------------------------------------------------------ Anthropic


@pytest.mark.integration
def test_anthropic_sdk_create_stream_errors_and_count_tokens() -> None:
    def use(url: str) -> dict[str, Any]:
        client = anthropic_client(url)
        out: dict[str, Any] = {}
        out["message"] = client.messages.create(
            model=MODEL, max_tokens=64, system="Be brief.", messages=[{"role": "user", "content": QUESTION}],
            stop_sequences=["\n\n", "END", "x", "y", "z"], extra_body={"temperature": 0, "top_p": 0.9, "top_k": 5},
        )
        with client.messages.stream(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": QUESTION}]) as stream:
            out["streamed"] = "".join(stream.text_stream)
            out["final"] = stream.get_final_message()
        try:
            client.messages.create(model=MODEL, max_tokens=10, messages=[])
        except anthropic.BadRequestError as exc:
            out["bad"] = exc
        try:
            client.messages.create(model=UNPLACED, max_tokens=10, messages=[{"role": "user", "content": "hi"}])
        except anthropic.ConflictError as exc:
            out["conflict"] = exc
        try:
            client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}],
                                   tools=[{"name": "no spaces allowed", "input_schema": {"type": "object"}}])
        except anthropic.BadRequestError as exc:
            out["tools"] = exc
        out["count"] = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "one two three"}])
        return out

    async def body(url: str, backend: FakeMaster) -> None:
        out = await in_thread(lambda: use(url))
        message = out["message"]
        assert message.content[0].text == TEXT and message.stop_reason == "end_turn" and message.role == "assistant"
        assert (message.usage.input_tokens, message.usage.output_tokens) == (12, len(TOKENS))
        assert out["streamed"] == TEXT and out["final"].stop_reason == "end_turn"
        assert out["final"].usage.output_tokens == len(TOKENS)
        assert out["bad"].status_code == 400 and out["bad"].body["error"]["type"] == "invalid_request_error"
        assert out["conflict"].status_code == 409
        assert "tools" in str(out["tools"])
        assert out["count"].input_tokens == 6
        first = submits(backend)[0].params
        assert [(m.role, m.content) for m in first.messages] == [("system", "Be brief."), ("user", QUESTION)]
        assert (first.max_tokens, first.temperature, first.top_p, first.top_k) == (64, 0.0, 0.9, 5)
        assert first.stop == ("\n\n", "END", "x", "y", "z")  # more than OpenAI's old limit of 4

    run_served(body)


def test_anthropic_stream_event_sequence_and_stop_sequence() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        def script(cmd):
            s = reply_script(cmd.task_id)
            s[-1] = FinishChunk(task_id=cmd.task_id, finish_reason="stop", prompt_tokens=12, completion_tokens=6, stop_sequence="END")
            return s

        backend.script = script
        payload = {"model": MODEL, "max_tokens": 20, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        r = await client.post("/v1/messages", json=payload)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [block.split("\n") for block in r.text.strip().split("\n\n")]
        names = [e[0].removeprefix("event: ") for e in events]
        datas = [json.loads(e[1].removeprefix("data: ")) for e in events]
        assert names[:3] == ["message_start", "content_block_start", "ping"]
        assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
        assert set(names[3:-3]) == {"content_block_delta"}
        assert [d["type"] for d in datas] == names
        assert datas[0]["message"]["usage"]["input_tokens"] == 12
        assert datas[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
        assert "".join(d["delta"]["text"] for d in datas if d["type"] == "content_block_delta") == TEXT
        r = await client.post("/v1/messages", json={**payload, "stream": False})
        assert r.json()["stop_reason"] == "stop_sequence" and r.json()["stop_sequence"] == "END"

    run_api(body)


@pytest.mark.integration
def test_anthropic_keys_right_one_works_wrong_one_is_authentication_error() -> None:
    def use(url: str) -> tuple[Any, Any]:
        good = anthropic_client(url, api_key=KEY).messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        try:
            anthropic_client(url, api_key="wrong").messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        except anthropic.AuthenticationError as exc:
            return good, exc
        raise AssertionError("a wrong key was accepted")

    async def body(url: str, backend: FakeMaster) -> None:
        good, bad = await in_thread(lambda: use(url))
        assert good.content[0].text == TEXT
        assert bad.status_code == 401 and bad.body["error"]["type"] == "authentication_error"

    run_served(body, access=AccessPolicy.of([KEY]))


# --------------------------------------------------------------------------------- Ollama


@pytest.mark.integration
def test_ollama_client_chat_generate_list_ps_show() -> None:
    def use(url: str) -> dict[str, Any]:
        client = ollama.Client(host=url, timeout=10)
        out: dict[str, Any] = {}
        out["chat"] = client.chat(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                  options={"temperature": 0, "top_k": 7, "num_predict": 30, "stop": ["\n"], "seed": 3,
                                           "repeat_penalty": 1.2, "num_ctx": 4096})
        out["chat_stream"] = list(client.chat(model=MODEL, messages=[{"role": "user", "content": QUESTION}], stream=True))
        out["generate"] = client.generate(model=MODEL, prompt=QUESTION, system="Be brief.")
        out["raw"] = client.generate(model=MODEL, prompt="<|im_start|>user\nhi", raw=True, options={"num_predict": -1})
        out["list"] = client.list()
        out["ps"] = client.ps()
        out["show"] = client.show(MODEL)
        for name, call in (("missing", lambda: client.chat(model="no-such-model", messages=[{"role": "user", "content": "hi"}])),
                           ("mirostat", lambda: client.generate(model=MODEL, prompt="hi", options={"mirostat": 2}))):
            try:
                call()
            except ollama.ResponseError as exc:
                out[name] = exc
        return out

    async def body(url: str, backend: FakeMaster) -> None:
        placed = await backend.command(__import__("exo_p2p.types", fromlist=["PlaceInstance"]).PlaceInstance(command_id="c1", model_id=MODEL))
        assert placed.error is None
        out = await in_thread(lambda: use(url))
        chat = out["chat"]
        assert chat.message.content == TEXT and chat.done and chat.done_reason == "stop"
        assert chat.eval_count == len(TOKENS) and chat.prompt_eval_count == 12 and chat.total_duration > 0
        parts = out["chat_stream"]
        assert "".join(p.message.content for p in parts) == TEXT
        assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
        assert out["generate"].response == TEXT and out["raw"].response == TEXT
        assert MODEL in [m.model for m in out["list"].models]
        assert out["show"].modelinfo["llama.context_length"] == 8192
        assert out["missing"].status_code == 404 and "not found" in out["missing"].error
        assert out["mirostat"].status_code == 400 and "mirostat" in out["mirostat"].error
        chat_p, _, gen_p, raw_p = (s.params for s in submits(backend)[:4])
        assert (chat_p.temperature, chat_p.top_k, chat_p.max_tokens, chat_p.stop, chat_p.seed, chat_p.repetition_penalty) == (0.0, 7, 30, ("\n",), 3, 1.2)
        assert [(m.role, m.content) for m in gen_p.messages] == [("system", "Be brief."), ("user", QUESTION)]
        assert raw_p.prompt == "<|im_start|>user\nhi" and raw_p.messages == () and raw_p.max_tokens is None

    run_served(body)


def test_ollama_ps_lists_ready_models_and_root_probe() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        assert (await client.get("/api/ps")).json() == {"models": []}
        r = await client.get("/")
        assert r.status_code == 200 and r.text == "Ollama is running"
        r = await client.head("/")
        assert r.status_code == 200 and r.content == b""
        assert (await client.get("/api/version")).json()["version"]
        r = await client.post("/api/chat", json={"model": MODEL, "messages": []})
        assert r.json()["done"] is True and r.json()["done_reason"] == "load" and not submits(backend)
        r = await client.post("/api/chat", json={"model": "no-such-model", "messages": []})
        assert r.status_code == 404 and set(r.json()) == {"error"}
        r = await client.get("/api/nothing-here")
        assert r.status_code == 404 and set(r.json()) == {"error"}

    run_api(body)


def test_get_root_serves_the_dashboard_route_to_browsers_only() -> None:
    """``GET /`` is negotiated: a browser (Accept: text/html) gets the page of the route named
    ``dashboard`` (the node's own dashboard is always registered), every other client the
    Ollama banner it probes for."""

    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        browser = {"accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
        r = await client.get("/", headers=browser)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert r.text.lower().startswith("<!doctype html") and "dashboard" in r.text.lower()
        for accept in ("*/*", "application/json"):
            r = await client.get("/", headers={"accept": accept})
            assert r.text == "Ollama is running"

    run_api(body)


# --------------------------------------------------------------------------------- OpenAI


@pytest.mark.integration
def test_openai_responses_completions_models_and_sampling_extras() -> None:
    def use(url: str) -> dict[str, Any]:
        client = openai_client(url)
        out: dict[str, Any] = {}
        out["response"] = client.responses.create(model=MODEL, input=QUESTION, instructions="Be brief.", max_output_tokens=30, temperature=0)
        out["response_events"] = list(client.responses.create(
            model=MODEL, input=[{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}], stream=True))
        out["completion"] = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, stop=["\n"])
        out["completion_stream"] = list(client.completions.create(model=MODEL, prompt="The capital of France is", stream=True))
        out["model"] = client.models.retrieve(MODEL)
        out["chat"] = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": QUESTION}], presence_penalty=0.5, frequency_penalty=-0.5,
            logit_bias={"42": -100, "7": 5}, extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1},
        )
        for name, call in (
            ("store", lambda: client.responses.create(model=MODEL, input="hi", store=True)),
            ("previous", lambda: client.responses.create(model=MODEL, input="hi", previous_response_id="resp_1")),
            ("echo", lambda: client.completions.create(model=MODEL, prompt="hi", echo=True)),
        ):
            try:
                call()
            except openai.BadRequestError as exc:
                out[name] = exc
        try:
            client.models.retrieve("no-such-model")
        except openai.NotFoundError as exc:
            out["missing"] = exc
        return out

    async def body(url: str, backend: FakeMaster) -> None:
        out = await in_thread(lambda: use(url))
        response = out["response"]
        assert response.output_text == TEXT and response.status == "completed" and response.usage.output_tokens == len(TOKENS)
        kinds = [e.type for e in out["response_events"]]
        assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
        assert kinds[-1] == "response.completed" and "response.output_text.done" in kinds
        assert "".join(e.delta for e in out["response_events"] if e.type == "response.output_text.delta") == TEXT
        assert [e.sequence_number for e in out["response_events"]] == list(range(len(kinds)))
        assert out["response_events"][-1].response.output_text == TEXT
        assert out["completion"].choices[0].text == TEXT and out["completion"].object == "text_completion"
        assert "".join(c.choices[0].text for c in out["completion_stream"] if c.choices) == TEXT
        assert out["model"].id == MODEL and out["model"].object == "model"
        assert out["chat"].choices[0].message.content == TEXT
        for name in ("store", "previous", "echo"):
            assert out[name].status_code == 400
        assert "not stored" in out["store"].message and out["previous"].body["param"] == "previous_response_id"
        assert out["missing"].status_code == 404
        resp_p, _, comp_p, _, chat_p = (s.params for s in submits(backend))
        assert [(m.role, m.content) for m in resp_p.messages] == [("system", "Be brief."), ("user", QUESTION)]
        assert (resp_p.max_tokens, resp_p.temperature) == (30, 0.0)
        assert comp_p.prompt == "The capital of France is" and comp_p.messages == () and comp_p.stop == ("\n",)
        assert (chat_p.presence_penalty, chat_p.frequency_penalty, chat_p.top_k, chat_p.min_p, chat_p.repetition_penalty) == (0.5, -0.5, 20, 0.05, 1.1)
        assert chat_p.logit_bias == ((7, 5.0), (42, -100.0))
        assert chat_p.max_tokens is None  # no max_tokens: until the model stops or the context is full

    run_served(body)


# ------------------------------------------------- the shared path, on every family

FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "openai_chat": ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}),
    "openai_completions": ("/v1/completions", {"model": MODEL, "prompt": "hi", "stream": True}),
    "openai_responses": ("/v1/responses", {"model": MODEL, "input": "hi", "stream": True}),
    "anthropic": ("/v1/messages", {"model": MODEL, "max_tokens": 4000, "messages": [{"role": "user", "content": "hi"}], "stream": True}),
    "ollama_chat": ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
    "ollama_generate": ("/api/generate", {"model": MODEL, "prompt": "hi"}),
}


def failing_script(task_id):
    return [
        PrefillProgressChunk(task_id=task_id, processed=0, total=12),
        TokenChunk(task_id=task_id, text="Paris", completion_tokens=1),
        ErrorChunk(task_id=task_id, error=ErrorInfo(503, "runner died mid-generation", "server_error", code="generation_failed")),
    ]


@pytest.mark.integration
def test_failure_mid_stream_ends_every_family_with_its_error_through_its_client() -> None:
    def use(url: str) -> dict[str, Any]:
        seen: dict[str, Any] = {}

        def attempt(name: str, fn) -> None:
            try:
                seen[name] = ("ended", fn())
            except Exception as exc:  # noqa: BLE001 - which error each client raises is what is checked
                seen[name] = ("raised", exc)

        oc, ac, lc = openai_client(url), anthropic_client(url), ollama.Client(host=url, timeout=10)
        msgs = [{"role": "user", "content": "hi"}]
        attempt("openai_chat", lambda: list(oc.chat.completions.create(model=MODEL, messages=msgs, stream=True)))
        attempt("openai_completions", lambda: list(oc.completions.create(model=MODEL, prompt="hi", stream=True)))
        attempt("openai_responses", lambda: list(oc.responses.create(model=MODEL, input="hi", stream=True)))
        attempt("anthropic", lambda: list(ac.messages.create(model=MODEL, max_tokens=50, messages=msgs, stream=True)))
        attempt("ollama_chat", lambda: list(lc.chat(model=MODEL, messages=msgs, stream=True)))
        attempt("ollama_generate", lambda: list(lc.generate(model=MODEL, prompt="hi", stream=True)))
        return seen

    async def body(url: str, backend: FakeMaster) -> None:
        backend.script = lambda cmd: failing_script(cmd.task_id)
        seen = await in_thread(lambda: use(url))
        for name in ("openai_chat", "openai_completions"):
            how, exc = seen[name]
            assert how == "raised" and isinstance(exc, openai.APIError) and "runner died" in str(exc), seen[name]
        how, events = seen["openai_responses"]
        assert how == "ended"
        assert [e.type for e in events][-2:] == ["error", "response.failed"]
        assert "runner died" in events[-1].response.error.message
        how, exc = seen["anthropic"]
        assert how == "raised" and isinstance(exc, anthropic.APIStatusError) and "runner died" in str(exc), seen["anthropic"]
        for name in ("ollama_chat", "ollama_generate"):
            how, exc = seen[name]
            assert how == "raised" and isinstance(exc, ollama.ResponseError) and "runner died" in str(exc), seen[name]
        with trio.fail_after(5):  # every chunk channel is closed (the last one may still be closing)
            while backend.channels:
                await trio.sleep(0.01)

    run_served(body)


@pytest.mark.integration
@pytest.mark.parametrize("family", list(FAMILIES))
def test_client_disconnect_cancels_the_generation_on_every_family(family: str) -> None:
    path, payload = FAMILIES[family]

    async def body(url: str, backend: FakeMaster) -> None:
        backend.script = lambda cmd: reply_script(cmd.task_id, ["tok"] * 500, delay=0.02)
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:
            async with client.stream("POST", path, json=payload) as r:
                assert r.status_code == 200
                async with aclosing(r.aiter_lines()) as lines:
                    async for line in lines:
                        if "tok" in line:
                            break
        with trio.fail_after(5):
            await backend.cancel_seen.wait()
        (submit,) = submits(backend)
        assert backend.cancelled == {submit.task_id}
        with trio.fail_after(5):
            while submit.task_id in backend.channels:
                await trio.sleep(0.01)

    run_served(body)


@pytest.mark.integration
@pytest.mark.parametrize("family", list(FAMILIES))
def test_keep_alives_flow_during_a_long_prefill_and_a_queue(family: str) -> None:
    """A stream is never silent for much longer than the keep-alive interval (0.2 s here; 5 s by
    default, under the 10 s proxies allow): neither while queued (no chunk yet) nor during a
    prefill; the keep-alives do not change the text."""
    path, payload = FAMILIES[family]

    def script(cmd):
        return [1.2, PrefillProgressChunk(task_id=cmd.task_id, processed=0, total=12), 1.2,
                *reply_script(cmd.task_id)[1:]]

    async def body(url: str, backend: FakeMaster) -> None:
        backend.script = script
        arrivals: list[float] = []
        raw = b""
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:
            t0 = trio.current_time()
            async with client.stream("POST", path, json=payload) as r:
                assert r.status_code == 200
                async for part in r.aiter_raw():
                    arrivals.append(trio.current_time() - t0)
                    raw += part
        gaps = [b - a for a, b in zip([0.0, *arrivals], arrivals)]
        # each pause is 1.2 s; with keep-alives every 0.2 s no gap comes near it (slack for a
        # loaded machine: 0.9 s)
        assert arrivals[-1] > 2.4 and max(gaps) < 0.9, gaps
        text = raw.decode()
        if family.startswith("ollama"):
            lines = [json.loads(line) for line in text.splitlines()]
            assert "".join(d.get("response", d.get("message", {}).get("content", "")) for d in lines) == TEXT
            assert lines[-1]["done"] is True
            assert sum(1 for d in lines if not d["done"] and not d.get("response", d.get("message", {}).get("content"))) >= 4
        else:
            # Responses' keep-alives are response.in_progress events (event-counting idle
            # timers reset on them), after the one the stream opens with
            keepalives = text.count(": keep-alive") + text.count("event: ping") + text.count("event: response.in_progress") - (
                1 if family == "openai_responses" else 0)
            assert keepalives >= 4, text
            assert TOKENS[0] in text and TOKENS[-2] in text

    run_served(body, generation=GenerationSettings(keepalive_interval=0.2))
