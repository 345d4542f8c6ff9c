"""Work a request asked for, stopped when its client leaves (docs/api.md).

``until_disconnect`` runs an awaitable function beside a watch of the request's ASGI
``receive`` channel: an ``http.disconnect`` cancels the work (a hub read waited for in a
thread is abandoned: ``exo_p2p.models.hub.resolve``) and raises Starlette's
``ClientDisconnect``, which the app logs without answering. Used by the routes that may read
a model hub (previews and placements of a model no node holds).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio
from starlette.requests import ClientDisconnect, Request

T = TypeVar("T")


async def until_disconnect(request: Request, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``await fn(*args)``, cancelled when the client disconnects first. Call it after the
    request's body was read (the watch takes the messages that follow). Raises
    ``ClientDisconnect`` when the client left, else what ``fn`` raises."""
    result: list[T] = []
    gone = False

    async def watch(scope: trio.CancelScope) -> None:
        nonlocal gone
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                gone = True
                scope.cancel()
                return

    async def run(scope: trio.CancelScope) -> None:
        result.append(await fn(*args))
        scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, nursery.cancel_scope)
        nursery.start_soon(run, nursery.cancel_scope)
    if gone or not result:
        raise ClientDisconnect()
    return result[0]
