"""A deadline for request bodies: a client that sends its body slowly is answered 408 and closed.

hypercorn bounds a request's head (its keep-alive timer, ``exo_p2p.api.server``) but not its
body: once the head is in, a client may send a byte every few seconds and hold the
connection, and the app task reading it, forever (a slowloris). ``BodyDeadline`` wraps the
ASGI app so that the whole body must arrive within ``BODY_TIMEOUT`` seconds of the request's
start; past that the app's ``receive`` reports a disconnect (``BodyTimedOut``, a starlette
``ClientDisconnect``, which the routes already treat as a client gone) and, when no response
was started, the client gets a 408 with ``connection: close``. hypercorn then closes the
connection, since the request was not read to its end. After the body, ``receive`` has no
deadline (a streamed answer waits for a disconnect as long as it runs).
"""

from __future__ import annotations

import json

import trio
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

BODY_TIMEOUT = 20.0
"""Seconds a request's whole body may take to arrive (the largest body, 8 MiB, needs
~420 KiB/s)."""


class BodyTimedOut(ClientDisconnect):
    """The request's body did not arrive within its deadline."""


class BodyDeadline:
    """ASGI middleware: the body of each HTTP request within ``seconds`` of its start, else a
    408 JSON error ``{"error": {"message", "type": "request_timeout", "code": 408}}`` (when the
    response has not started) and the connection closed. Other scopes pass through."""

    def __init__(self, app: ASGIApp, seconds: float = BODY_TIMEOUT) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = trio.current_time() + self.seconds
        body_done = False
        timed_out = False
        started = False

        async def timed_receive() -> Message:
            nonlocal body_done, timed_out
            if body_done:
                return await receive()
            with trio.move_on_at(deadline):
                message = await receive()
                body_done = message["type"] != "http.request" or not message.get("more_body", False)
                return message
            timed_out = True
            raise BodyTimedOut()

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, timed_receive, tracking_send)
        except BodyTimedOut:
            pass
        if timed_out and not started:
            await _send_408(send, self.seconds)


async def _send_408(send: Send, seconds: float) -> None:
    body = json.dumps({"error": {"message": f"the request body did not arrive within {seconds:g} s",
                                 "type": "request_timeout", "code": 408}}).encode()
    await send({"type": "http.response.start", "status": 408,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
