"""``count_tokens`` is bounded in the text it tokenizes (413) and in how many requests one
node tokenizes at once (429), in Anthropic's error shape (``exo_p2p.api.bounds``). In process,
with the fake backend of ``tests/test_api.py`` (no socket, no process: the unit tier)."""

from __future__ import annotations

from typing import Any

import httpx
import trio

from exo_p2p.api import create_app
from exo_p2p.api.bounds import COUNT_TOKENS_CONCURRENCY, MAX_COUNT_TOKENS_TEXT_BYTES

try:
    from tests.support.fake_master import MODEL, FakeMaster, run_api
    from tests.support.family_errors import family_error
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    from test_api import MODEL, FakeMaster, run_api  # type: ignore[no-redef]
    from test_request_bounds import family_error  # type: ignore[no-redef]

COUNT = "/v1/messages/count_tokens"


def test_count_tokens_past_its_text_bound_is_a_413_in_anthropics_shape() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        half = "x" * (MAX_COUNT_TOKENS_TEXT_BYTES // 2)
        over = {"model": MODEL, "system": half, "messages": [{"role": "user", "content": half + "y"}]}
        r = await client.post(COUNT, json=over)
        message, kind = family_error(r, 413)
        assert kind == "request_too_large" and str(MAX_COUNT_TOKENS_TEXT_BYTES) in message
        at_limit = {"model": MODEL, "system": half, "messages": [{"role": "user", "content": half}]}
        assert (await client.post(COUNT, json=at_limit)).json() == {"input_tokens": 8}

    run_api(body)


class SlowCounter(FakeMaster):
    """Counting waits for ``release`` (a tokenizer at work); ``counting`` counts those waiting."""

    def __init__(self, nursery: trio.Nursery) -> None:
        super().__init__(nursery)
        self.release = trio.Event()
        self.counting = 0

    async def count_tokens(self, model_id: str, params: Any) -> int:
        self.counting += 1
        await self.release.wait()
        return await super().count_tokens(model_id, params)


def test_count_tokens_beyond_its_concurrency_is_a_429_and_the_slots_come_back() -> None:
    request = {"model": MODEL, "messages": [{"role": "user", "content": "one two"}]}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            backend = SlowCounter(nursery)
            transport = httpx.ASGITransport(app=create_app(backend))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                with trio.fail_after(10):
                    answers: list[httpx.Response] = []

                    async def count() -> None:
                        answers.append(await client.post(COUNT, json=request))

                    async with trio.open_nursery() as waiting:
                        for _ in range(COUNT_TOKENS_CONCURRENCY):
                            waiting.start_soon(count)
                        while backend.counting < COUNT_TOKENS_CONCURRENCY:
                            await trio.sleep(0.01)
                        message, kind = family_error(await client.post(COUNT, json=request), 429)
                        assert kind == "rate_limit_error" and "at once" in message
                        backend.release.set()
                    assert [a.json() for a in answers] == [{"input_tokens": 5}] * COUNT_TOKENS_CONCURRENCY
                    assert (await client.post(COUNT, json=request)).json() == {"input_tokens": 5}
                    failing = request | {"model": "no-such-model"}
                    for _ in range(COUNT_TOKENS_CONCURRENCY + 1):  # a refused count gives its slot back too
                        family_error(await client.post(COUNT, json=failing), 404)
                    assert (await client.post(COUNT, json=request)).status_code == 200
            nursery.cancel_scope.cancel()

    trio.run(main)
