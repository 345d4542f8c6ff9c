"""Hub reads kept apart from the node's lifeblood (docs/models.md#hub-resolution-and-its-bounds).

A repo's resolution (listing, small files, safetensors headers:
``hub.manifest.resolve_hub_model``) is blocking I/O against an untrusted server. ``Resolver``
runs it so that a slow or hostile hub cannot stall the node:

- **its own limiter**: at most ``hub_limits.RESOLVE_THREADS`` resolutions in threads at once,
  never trio's shared default limiter (40 threads shared with shard fetches, pulls, bulk
  serving and the worker);
- **a deadline** per repo (``RESOLVE_DEADLINE``) and per file (``FILE_DEADLINE``), enforced in
  the thread by a ``hub.stop.Stop`` checked on every block received (``HubTimeout``: 504);
- **abandoned on cancel**: the waiting task returns at once when cancelled (client gone,
  node stopping) and sets the ``Stop``, so the thread ends at its next block or socket
  timeout;
- **single-flight**: concurrent requests for the same (repo, revision) share one resolution;
  when its leader is cancelled, a waiter still there starts it again.

Chosen over a killable child process with a memory limit: the bounds of ``hub_limits`` cap
what a resolution may hold before anything is sized, so memory needs no second fence, and a
thread costs nothing to start (a child process would add ~0.3 s of interpreter start and
imports to every preview and placement of a hub model).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from exo_p2p.models.hub.stop import HubTimeout, Stop
from exo_p2p.models.hub_limits import RESOLVE_DEADLINE, RESOLVE_THREADS


class _Flight:
    """One resolution in progress: waited for by ``Resolver.run`` callers of the same key."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.abandoned = False


class Resolver:
    """Runs blocking hub resolutions as the module docstring says. ``threads``: the limiter's
    size; ``deadline``: seconds a resolution may take in all."""

    def __init__(self, threads: int = RESOLVE_THREADS, deadline: float = RESOLVE_DEADLINE) -> None:
        self.limiter = trio.CapacityLimiter(threads)
        self.deadline = deadline
        self._flights: dict[object, _Flight] = {}
        self.started = 0  # resolutions started (a test counts them: single-flight)

    async def run(self, key: object, fn: Callable[..., Any], *args: Any, what: str = "the hub read") -> Any:
        """``fn(*args, stop)`` in a thread (``stop``: a ``Stop`` with this resolver's deadline),
        shared by concurrent callers with the same ``key``. Raises what ``fn`` raises
        (``HubTimeout`` past the deadline); ``trio.Cancelled`` for a cancelled caller."""
        while True:
            flight = self._flights.get(key)
            if flight is None:
                return await self._lead(key, fn, args, what)
            await flight.done.wait()
            if not flight.abandoned:
                if flight.error is not None:
                    raise flight.error
                return flight.result

    async def _lead(self, key: object, fn: Callable[..., Any], args: tuple, what: str) -> Any:
        flight = self._flights[key] = _Flight()
        self.started += 1
        stop = Stop(self.deadline, what)
        try:
            with trio.move_on_after(self.deadline + 1.0) as late:  # the thread's own check comes first
                flight.result = await trio.to_thread.run_sync(fn, *args, stop, limiter=self.limiter,
                                                              abandon_on_cancel=True)
            if late.cancelled_caught:
                raise HubTimeout(f"{what} took more than its deadline of {self.deadline:g} s; try again later")
            return flight.result
        except trio.Cancelled:
            flight.abandoned = True
            raise
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            stop.set()  # a thread still running (cancelled, late) stops at its next block
            del self._flights[key]
            flight.done.set()
