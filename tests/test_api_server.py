"""The API served by hypercorn on 127.0.0.1 (``exo_p2p.api.serve``): the ``openai`` client against
it, a disconnect cancelling the generation, a port already bound, a body over the limit, and
shutdown with a stream open.
"""

from __future__ import annotations

import logging
import socket
from contextlib import aclosing
from typing import Any

import httpx
import pytest
import structlog
import structlog.testing
import trio

from exo_p2p.api import ApiBindError, create_app, serve
from tests.support.fake_master import FakeMaster, JSON, MODEL, TOKENS, UNPLACED, assert_openai_error, chat_body, reply_script, run_served, submits


@pytest.mark.integration
def test_openai_client_against_real_server(caplog: pytest.LogCaptureFixture) -> None:
    openai = pytest.importorskip("openai")
    caplog.set_level(logging.INFO)

    def use_client(base_url: str) -> tuple[Any, list[Any]]:
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=10)
        try:
            completion = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}], temperature=0
            )
            stream = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "What is the capital of France?"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = list(stream)
            try:
                client.chat.completions.create(model=UNPLACED, messages=[{"role": "user", "content": "hi"}])
            except openai.ConflictError as exc:
                chunks.append(exc)
            return completion, chunks
        finally:
            client.close()

    async def body(url: str, backend: FakeMaster) -> None:
        completion, chunks = await trio.to_thread.run_sync(use_client, url)
        assert completion.choices[0].message.content == "".join(TOKENS)
        assert completion.choices[0].finish_reason == "stop"
        assert completion.usage.completion_tokens == len(TOKENS)
        conflict = chunks.pop()
        assert conflict.status_code == 409
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "".join(TOKENS)
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
        assert chunks[-1].usage.total_tokens == 12 + len(TOKENS)

    run_served(body)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


@pytest.mark.integration
def test_real_server_disconnect_cancels_generation() -> None:
    async def body(url: str, backend: FakeMaster) -> None:
        backend.script = lambda cmd: reply_script(cmd.task_id, ["tok"] * 500, delay=0.02)
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:
            async with client.stream("POST", "/v1/chat/completions", json=chat_body(stream=True)) as r:
                assert r.status_code == 200
                async with aclosing(r.aiter_lines()) as lines:
                    async for line in lines:
                        if '"tok"' in line:
                            break
        with trio.fail_after(5):
            await backend.cancel_seen.wait()
        (submit,) = submits(backend)
        assert backend.cancelled == {submit.task_id}
        with trio.fail_after(5):
            while submit.task_id in backend.channels:
                await trio.sleep(0.01)
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:
            assert (await client.get("/state")).status_code == 200

    run_served(body)


@pytest.mark.integration
def test_bind_failure_is_a_clear_oserror() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        app = create_app(FakeMaster(None))  # type: ignore[arg-type]  # never generates
        with pytest.raises(ApiBindError) as info:
            trio.run(serve, app, "127.0.0.1", port)
        assert isinstance(info.value, OSError)
        assert str(info.value) == f"port {port} on 127.0.0.1 is in use"


@pytest.mark.integration
def test_real_server_413_then_keeps_serving() -> None:
    async def body(url: str, backend: FakeMaster) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            r = await client.post("/v1/chat/completions", content=b"x" * 10_000_000, headers=JSON)
            assert assert_openai_error(r, 413)["code"] == "request_too_large"
            r = await client.post("/v1/chat/completions", content=b'{"model": "\xff", "messages": []}', headers=JSON)
            assert "UTF-8" in assert_openai_error(r, 400)["message"]
            assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 200

    run_served(body)


@pytest.mark.integration
@pytest.mark.parametrize("how", ["shutdown_event", "cancel"])
def test_shutdown_with_a_stream_open_is_quiet_and_cancels_it(
    how: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            backend = FakeMaster(nursery)
            backend.script = lambda cmd: reply_script(cmd.task_id, ["tok"] * 2000, delay=0.01)
            stop = trio.Event()
            returned = trio.Event()

            async def run_server(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
                with trio.CancelScope() as scope:
                    server_scope.append(scope)
                    app = create_app(backend)
                    await serve(app, "127.0.0.1", 0, task_status=task_status, shutdown_event=stop, graceful_timeout=0.5)
                returned.set()

            server_scope: list[trio.CancelScope] = []
            url = f"http://127.0.0.1:{await nursery.start(run_server)}"
            async with httpx.AsyncClient(base_url=url, timeout=5) as client:
                async with client.stream("POST", "/v1/chat/completions", json=chat_body(stream=True)) as r:
                    async with aclosing(r.aiter_lines()) as lines:
                        async for line in lines:
                            if '"tok"' in line:
                                break
                    t0 = trio.current_time()
                    if how == "cancel":
                        server_scope[0].cancel()
                    else:
                        stop.set()
                    with trio.fail_after(5):
                        await returned.wait()
                    assert trio.current_time() - t0 < 3.0
            assert len(backend.cancelled) == 1 and not backend.channels
            nursery.cancel_scope.cancel()

    with structlog.testing.capture_logs() as events:
        trio.run(main)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not errors, [(r.name, r.getMessage()) for r in errors]
    assert not [e for e in events if e["log_level"] in ("error", "critical", "exception")], events
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
