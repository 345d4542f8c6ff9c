"""Accept loops that hold a bound and survive the OS's bad moments.

A listener of the node (the HTTP API, the model-transfer port) accepts through
:func:`serve_bounded`: at most ``max_connections`` connections are served at once, one
beyond it, or beyond ``per_source`` from one source address (``exo_p2p.listen.admission``), is
closed on arrival (counted, logged at most every ``REFUSAL_LOG_EVERY`` s), and
an accept that fails with a transient error (:func:`is_transient`: out of descriptors,
buffers or memory, a connection aborted before it was accepted) is retried after a pause
that doubles from ``BACKOFF_FIRST`` to ``BACKOFF_MAX`` s (:func:`backoff_delay`) instead of
ending the loop — and with it the node. Any other accept error still ends the loop; a
handler that raises ends its own connection only (logged).

Background loops that touch the OS each round (reading ``/proc``, opening files) use
:class:`Backoff` the same way: a transient error costs one round, never the process.
"""

from __future__ import annotations

import errno
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
import trio

from exo_p2p.listen.admission import peer_ip, per_source_cap

log = structlog.get_logger(__name__)

TRANSIENT_ERRNOS = frozenset({
    errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED, errno.EPROTO,
    errno.EAGAIN, errno.EINTR,
})
"""``errno`` values an accept or a round of a background loop may hit and recover from:
out of descriptors (process or system), buffers or memory; a connection aborted or failed
before it was accepted; a call interrupted or that would block."""
BACKOFF_FIRST = 0.05
"""Seconds of the first pause after a transient error."""
BACKOFF_MAX = 2.0
"""Seconds a pause after transient errors in a row grows to at most."""
REFUSAL_LOG_EVERY = 10.0
"""Seconds between two log records of connections refused at a listener's cap."""


def is_transient(exc: BaseException) -> bool:
    """True for an ``OSError`` whose errno is in ``TRANSIENT_ERRNOS``. Pure."""
    return isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS


def backoff_delay(failures: int, first: float = BACKOFF_FIRST, cap: float = BACKOFF_MAX) -> float:
    """Seconds to pause after ``failures`` (≥ 1) transient errors in a row: ``first`` doubling
    each time, at most ``cap``; 0 for no failure. Pure."""
    if failures <= 0:
        return 0.0
    return min(cap, first * 2 ** min(failures - 1, 30))


class Backoff:
    """Pauses of a loop after transient errors: ``await pause(exc)`` logs the error (the first
    of a run, then every tenth) and sleeps :func:`backoff_delay`; ``reset()`` after a success.
    ``name`` goes into the log."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.failures = 0

    async def pause(self, exc: BaseException) -> None:
        self.failures += 1
        delay = backoff_delay(self.failures)
        if self.failures % 10 == 1:
            log.warning("transient OS error; backing off", loop=self.name, error=str(exc),
                        in_a_row=self.failures, pause_s=delay)
        await trio.sleep(delay)

    def reset(self) -> None:
        self.failures = 0

    async def ride_out(self, exc: OSError) -> None:
        """``pause(exc)`` when ``exc`` is transient (:func:`is_transient`); raises it otherwise."""
        if not is_transient(exc):
            raise exc
        await self.pause(exc)


class Refusals:
    """Connections refused at a cap: ``count`` in all, logged at most every
    ``REFUSAL_LOG_EVERY`` s (by trio's clock)."""

    def __init__(self, name: str, cap: int) -> None:
        self.name, self.cap, self.count = name, cap, 0
        self._logged_at = -REFUSAL_LOG_EVERY

    def add(self) -> None:
        self.count += 1
        now = trio.current_time()
        if now - self._logged_at >= REFUSAL_LOG_EVERY:
            self._logged_at = now
            log.warning("connection refused: listener at its cap", listener=self.name, cap=self.cap,
                        refused_so_far=self.count)


async def _run(stream: trio.SocketStream, handler: Callable[[trio.SocketStream], Awaitable[Any]],
               slots: trio.CapacityLimiter, sources: Counter[str], source: str) -> None:
    try:
        await handler(stream)
    except Exception:  # one connection's failure is not the listener's (nor the node's)
        log.exception("connection handler failed")
    finally:
        slots.release_on_behalf_of(stream)
        sources[source] -= 1
        if not sources[source]:
            del sources[source]
        await trio.aclose_forcefully(stream)


async def serve_bounded(
    listener: trio.SocketListener,
    handler: Callable[[trio.SocketStream], Awaitable[Any]],
    *,
    max_connections: int,
    name: str,
    per_source: int | None = None,
    handler_nursery: trio.Nursery | None = None,
    task_status: trio.TaskStatus[Refusals] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept from ``listener`` forever, running ``handler(stream)`` for each connection in
    ``handler_nursery`` (a nursery of its own when None; the stream is closed when the handler
    returns) while fewer than ``max_connections`` are being served, and fewer than
    ``per_source`` (default ``exo_p2p.listen.admission.per_source_cap(max_connections)``) from its
    source address; a connection beyond either is closed at once. Transient accept errors pause the loop (:class:`Backoff`); any other
    ``OSError`` is raised. An exception of a handler is logged and ends its connection only. ``task_status.started`` gets the :class:`Refusals` counter. Closes
    ``listener`` on exit."""
    slots = trio.CapacityLimiter(max_connections)
    per_source = per_source_cap(max_connections) if per_source is None else per_source
    sources: Counter[str] = Counter()
    refusals = Refusals(name, max_connections)
    pause = Backoff(f"{name} accept")
    async with listener, trio.open_nursery() as own:
        nursery = handler_nursery or own
        task_status.started(refusals)
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                await pause.ride_out(exc)
                continue
            pause.reset()
            source = peer_ip(stream)
            try:
                if sources[source] >= per_source:
                    raise trio.WouldBlock
                slots.acquire_on_behalf_of_nowait(stream)
            except trio.WouldBlock:
                refusals.add()
                stream.socket.close()
                continue
            sources[source] += 1
            nursery.start_soon(_run, stream, handler, slots, sources, source)
