"""A new request whose model is being re-placed after a failure waits for it
(``exo_p2p.api.generation.resume``: requests not yet started wait for the re-placement, bounded), instead of a 503.

Found by scripts/chaos.py (one 2-node instance): after each kill, every request that arrived
while the re-placement loaded was answered "503 model is loading" at once — most of the
run's cluster-side failures. A model that loads for the first time (no failure behind it)
is still answered 503 at once, with ``Retry-After``.
"""

from __future__ import annotations

import httpx
import msgspec
import trio
from hypothesis import given
from hypothesis import strategies as st

from exo_p2p.api.app import create_app
from exo_p2p.api.generation.resume import replacement_coming, waits_for_replacement
from exo_p2p.types import CommandResult, ErrorInfo, State, SubmitTask
from tests.support.rules.strategies import _instance
from tests.support.fake_master import MODEL, FakeMaster, TOKENS, chat_body, sse_events

LOADING_503 = ErrorInfo(503, f"model '{MODEL}' is loading (0/30 layers); retry shortly", "server_error", code="loading")


def _with(instance_id: str, *, replaces: str | None = None, failed: str | None = None, gave_up: bool = False):  # type: ignore[no-untyped-def]
    inst = msgspec.structs.replace(_instance(instance_id, "node-a"), model_id=MODEL, replaces=replaces,
                                   failed_reason=failed, gave_up=gave_up)
    return inst


@given(replaces=st.booleans(), failed=st.booleans(), gave_up=st.booleans())
def test_replacement_coming_rule(replaces, failed, gave_up):
    inst = _with("i2", replaces="i1" if replaces else None, failed="node gone" if failed else None, gave_up=gave_up and failed)
    state = State(instances={"i2": inst})
    expected = (not failed and replaces) or (failed and not (gave_up and failed))
    assert replacement_coming(state, MODEL) == expected
    assert not replacement_coming(state, "other-model")
    assert waits_for_replacement(LOADING_503, state, MODEL) == expected
    assert not waits_for_replacement(ErrorInfo(404, "x", code="model_not_found"), state, MODEL)
    assert not waits_for_replacement(ErrorInfo(503, "x", code="out_of_memory"), state, MODEL)


class Replacing(FakeMaster):
    """The model's only instance is a re-placement that loads: the first ``refusals``
    submissions are refused 503 ``loading``, then accepted."""

    refusals = 3

    def __init__(self, nursery: trio.Nursery, *, replaces: str | None) -> None:
        super().__init__(nursery)
        self._state = msgspec.structs.replace(self._state, instances={"i2": _with("i2", replaces=replaces)})
        self.submits: list[SubmitTask] = []

    async def command(self, command, timeout: float = 30.0):  # type: ignore[no-untyped-def]
        if isinstance(command, SubmitTask):
            self.submits.append(command)
            if len(self.submits) <= self.refusals:
                self.log.append("command:SubmitTask")
                return CommandResult(command.command_id, error=LOADING_503)
        return await super().command(command, timeout)


def _run(body, *, replaces: str | None):  # type: ignore[no-untyped-def]
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            backend = Replacing(nursery, replaces=replaces)
            app = create_app(backend)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
                with trio.fail_after(20):
                    await body(client, backend)
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_request_waits_for_the_re_placement_and_completes():
    async def body(client: httpx.AsyncClient, backend: Replacing) -> None:
        for stream in (False, True):
            backend.submits.clear()
            r = await client.post("/v1/chat/completions", json=chat_body(stream=stream))
            assert r.status_code == 200, r.text
            text = "".join(TOKENS)
            if stream:
                assert '"finish_reason":"stop"' in r.text.replace(" ", "") and "error" not in "".join(sse_events(r.text))
            else:
                assert r.json()["choices"][0]["message"]["content"] == text
            assert len(backend.submits) == Replacing.refusals + 1
            assert len({s.task_id for s in backend.submits}) == 1  # one task, submitted again

    _run(body, replaces="i1")


def test_a_first_load_is_still_answered_503_at_once():
    async def body(client: httpx.AsyncClient, backend: Replacing) -> None:
        t0 = trio.current_time()
        r = await client.post("/v1/chat/completions", json=chat_body())
        assert r.status_code == 503 and r.json()["error"]["code"] == "loading"
        assert int(r.headers["retry-after"]) > 0
        assert len(backend.submits) == 1 and trio.current_time() - t0 < 1

    _run(body, replaces=None)
