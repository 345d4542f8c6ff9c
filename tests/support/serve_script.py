"""Serving a scripted node API for the limits tests."""

from __future__ import annotations

import trio
import trio.testing

from exo_p2p.listen.accept import serve_bounded


class _FakeListener:
    """accept(): raises the queued errors and returns the queued streams in order, then waits."""

    def __init__(self, script: list) -> None:  # type: ignore[type-arg]
        self.script = script

    async def accept(self):  # type: ignore[no-untyped-def]
        await trio.sleep(0.01)
        if not self.script:
            await trio.sleep_forever()
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    async def aclose(self) -> None:
        pass

    async def __aenter__(self):  # type: ignore[no-untyped-def]
        return self

    async def __aexit__(self, *exc) -> None:  # type: ignore[no-untyped-def]
        pass


def serve_script(script: list, seconds: float, **kw) -> tuple[list, int]:  # type: ignore[type-arg]
    """Run ``serve_bounded`` (``kw``: its caps) over ``script`` (``_FakeListener``) for
    ``seconds`` of a mock clock with handlers that never end: (streams served, refusals)."""
    served: list = []  # type: ignore[type-arg]
    out: list[int] = []

    async def handler(stream) -> None:  # type: ignore[no-untyped-def]
        served.append(stream)
        await trio.sleep_forever()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            refusals = await nursery.start(lambda task_status: serve_bounded(
                _FakeListener(script), handler, name="t", task_status=task_status, **kw))
            await trio.sleep(seconds)
            out.append(refusals.count)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return served, out[0]
