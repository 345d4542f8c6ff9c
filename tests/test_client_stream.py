"""``exo_p2p.api.generation.client_stream.ClientStream``: when a stream begins and when a keep-alive is
due (a stub encoder and ``send``; trio's clock, no server)."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from exo_p2p.api.generation.client_stream import ClientStream


class _Encoder:
    family = "openai"
    media_type = "text/event-stream"

    def start(self, prompt_tokens: int | None) -> bytes:
        return b"start\n"

    def keepalive(self) -> bytes:
        return b": keep-alive\n"


def _stream(sent: list[dict[str, Any]], stream: bool = True) -> ClientStream:
    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    return ClientStream(send, _Encoder(), stream=stream, keepalive_interval=5.0)  # type: ignore[arg-type]


def test_a_keepalive_is_due_an_interval_after_the_last_bytes_and_begins_the_stream() -> None:
    sent: list[dict[str, Any]] = []

    async def main() -> None:
        out = _stream(sent)
        assert out.until_keepalive(trio.current_time()) == 5.0  # not begun: a whole interval
        await out.keepalive_if_due(trio.current_time())  # not due yet: nothing sent
        assert sent == []
        await trio.sleep(5)
        await out.keepalive_if_due(trio.current_time() - 5)
        assert out.streaming and [m.get("status") for m in sent] == [200, None]
        await trio.sleep(2)
        assert out.until_keepalive(trio.current_time()) == 3.0
        await trio.sleep(3)
        await out.keepalive_if_due(0.0)
        assert sent[-1]["body"] == b": keep-alive\n" and out.until_keepalive(trio.current_time()) == 5.0

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_request_that_does_not_stream_gets_no_keepalive() -> None:
    sent: list[dict[str, Any]] = []

    async def main() -> None:
        out = _stream(sent, stream=False)
        await trio.sleep(60)
        await out.keepalive_if_due(0.0)
        assert sent == [] and not out.streaming

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
