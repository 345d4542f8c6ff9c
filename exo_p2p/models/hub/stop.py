"""How a thread reading a hub learns to stop (docs/models.md#hub-resolution-and-its-bounds).

A ``Stop`` is shared between the trio task that waits for a hub read and the thread doing
it: the task sets it when it is cancelled (its client left, the node stops), and it carries
a deadline (monotonic seconds). The thread calls ``check()`` before each request and on
every block that arrives (a hub trickling one byte a second is seen within a second), and
``wait()`` instead of ``time.sleep`` between retries. ``for_file(seconds)`` gives a stop
sharing the flag with a tighter deadline (one file's). Never blocks the trio side.
"""

from __future__ import annotations

import threading
import time


class HubStopped(RuntimeError):
    """The hub read was stopped: its waiter was cancelled. Never retried."""


class HubTimeout(HubStopped):
    """The hub read passed its deadline (the message names what and how long): answered 504."""


class Stop:
    """A cancel flag plus a deadline (``deadline``: ``time.monotonic()`` seconds, None: none;
    ``what``: named in the timeout's message, ``seconds`` the budget it had)."""

    def __init__(self, seconds: float | None = None, what: str = "the hub read", *,
                 _flag: threading.Event | None = None) -> None:
        self._flag = _flag if _flag is not None else threading.Event()
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds if seconds is not None else None
        self.what = what

    def set(self) -> None:
        """Stop every read that checks this flag (thread-safe, idempotent)."""
        self._flag.set()

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None: no deadline; never below 0)."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def check(self) -> None:
        """Raise ``HubStopped`` when set, ``HubTimeout`` past the deadline; else nothing."""
        if self._flag.is_set():
            raise HubStopped(f"{self.what} was stopped (its request was cancelled)")
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise HubTimeout(f"{self.what} took more than its deadline of {self.seconds:g} s; the hub is "
                             f"too slow or stalled: try again later")

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds`` (less when the deadline comes first), waking when set; then ``check()``."""
        left = self.remaining()
        self._flag.wait(seconds if left is None else min(seconds, left))
        self.check()

    def for_file(self, seconds: float, what: str) -> Stop:
        """A stop sharing this flag whose deadline is the sooner of this one's and ``seconds`` from now."""
        child = Stop(seconds, what, _flag=self._flag)
        left = self.remaining()
        if left is not None and left < seconds:
            child.deadline, child.seconds, child.what = self.deadline, self.seconds, self.what
        return child


def read_timeout(stop: Stop | None, timeout: float) -> float:
    """The socket timeout of one request: ``timeout`` (seconds), or less when ``stop``'s
    deadline is sooner (at least 0.1 s)."""
    left = stop.remaining() if stop is not None else None
    return timeout if left is None else max(0.1, min(timeout, left))
