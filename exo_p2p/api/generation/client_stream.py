"""The answer to one generation request as its client receives it: the status, the stream's
start, its events, its keep-alives, or one body.

A stream is begun (status 200, the encoder's media type and ``SSE_HEADERS``, the encoder's
start event) at its first chunk, or at its first keep-alive when no chunk came within
``keepalive_interval`` seconds; from then on the status is committed and an error can only be
sent as the family's in-stream error event. Begun, it never stays silent for
``keepalive_interval`` seconds while the request is waited for: the encoder's keep-alive (an
SSE comment, an Anthropic ``ping``, an empty NDJSON chunk) fills the silence, so proxies
never see a silent stream for 10 s. A request that does not stream gets one body.
"""

from __future__ import annotations

import trio
from starlette.types import Send

from exo_p2p.api.generation.job import SSE_HEADERS, StreamEncoder, send_bytes, send_error
from exo_p2p.types import ErrorInfo


INSTANCE_HEADER = "x-exo-instance"
"""The response header of a streamed answer naming the instance that serves it (the first
one: a request that moves later keeps it); the dashboard shows each answer's speed under
that instance."""

class ClientStream:
    """The ASGI ``send`` of one generation request, with when it last sent bytes.

    ``streaming`` is False until ``begin``; ``last_sent`` is the trio time of the last bytes
    sent on the stream. Nothing here waits for the cluster: every method returns once its
    bytes are handed to the server.
    """

    def __init__(self, send: Send, encoder: StreamEncoder, *, stream: bool, keepalive_interval: float) -> None:
        self._send = send
        self.encoder = encoder
        self.stream = stream
        """Whether the request asked for a stream (else it gets one body)."""
        self.keepalive_interval = keepalive_interval
        self.streaming = False
        """Whether the stream was begun (the status 200 and the start event sent)."""
        self.last_sent = 0.0
        self.instance: str | None = None
        """The instance the master gave the request to, once it did: a begun stream names it
        in its ``x-exo-instance`` header (``INSTANCE_HEADER``)."""

    async def begin(self, prompt_tokens: int | None) -> None:
        """Commit the status 200 and send the encoder's start event (``prompt_tokens``, when
        a prefill progress chunk told them, else None)."""
        headers = [(b"content-type", self.encoder.media_type.encode())]
        headers += [(k.encode(), v.encode()) for k, v in SSE_HEADERS.items()]
        if self.instance:
            headers.append((INSTANCE_HEADER.encode(), self.instance.encode()))
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})
        self.streaming = True
        self.last_sent = trio.current_time()
        await self.send(self.encoder.start(prompt_tokens))

    async def send(self, body: bytes, *, more: bool = True) -> None:
        """Send ``body`` on the begun stream (an empty body only when it is the last)."""
        if body or not more:
            await self._send({"type": "http.response.body", "body": body, "more_body": more})
            self.last_sent = trio.current_time()

    async def keepalive(self) -> None:
        """The encoder's keep-alive on the begun stream."""
        await self.send(self.encoder.keepalive())

    async def begin_or_keepalive(self) -> None:
        """Begin the stream when it was not begun yet, else send a keep-alive."""
        if not self.streaming:
            await self.begin(None)
        else:
            await self.keepalive()

    def until_keepalive(self, now: float) -> float:
        """Seconds from ``now`` until a keep-alive is due: ``keepalive_interval`` after the
        last bytes of a begun stream, or after ``now`` when the stream is not begun."""
        since = self.last_sent if self.streaming else now
        return max(0.0, since + self.keepalive_interval - now)

    async def keepalive_if_due(self, quiet_since: float) -> None:
        """While the request waits (a move): a stream's keep-alive when ``keepalive_interval``
        passed without bytes; a stream not begun yet is begun once ``keepalive_interval``
        passed since ``quiet_since``. Nothing for a request that does not stream."""
        if not self.stream:
            return
        now = trio.current_time()
        if not self.streaming:
            if now - quiet_since >= self.keepalive_interval:
                await self.begin(None)
        elif now - self.last_sent >= self.keepalive_interval:
            await self.keepalive()

    async def end_with_error(self, info: ErrorInfo) -> None:
        """End the begun stream with the family's in-stream error event."""
        await self.send(self.encoder.error(info), more=False)

    async def error_body(self, info: ErrorInfo) -> None:
        """Answer ``info``'s status with the family's error body (the stream not begun)."""
        await send_error(self._send, info, self.encoder.family)

    async def body(self, data: bytes) -> None:
        """Answer 200 with ``data`` as the one JSON body (a request that does not stream)."""
        await send_bytes(self._send, 200, data)
