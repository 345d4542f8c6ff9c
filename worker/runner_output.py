"""What a runner writes to its file descriptors 1 and 2, as JSON lines of the node's log.

With ``--log-format json`` every line a node writes must be one JSON object. A runner's
Python-level output already is (``exo_p2p.logs.configure.configure_runner_output``), but C and C++
code writes to fds 1 and 2 directly (MLX's ring backend: "[ring] Socket 3 was closed by the
peer"). So in JSON mode the supervisor gives the runner a pipe as its stdout and stderr and
feeds what arrives to an ``OutputRelay``:

- a line that is already a JSON object passes unchanged;
- any other line becomes ``{"event": "runner output", "line": …, "stream": "fd", …}``;
- a line is cut at ``MAX_LINE_CHARS`` characters (a binary blob never floods a record);
- at most ``max_lines_per_second`` lines are written per second; the rest are counted and
  said once, in the next second, as ``{"event": "runner output suppressed", "lines": n}``
  (a C library printing in a loop while a peer rank dies cannot swamp the node's event loop
  or its log).

With the console log format (``raw=True``) lines pass unchanged, under the same bounds. In
both formats every line, written or suppressed, is also shown to ``on_line``: the supervisor
learns there that MLX's ring gave up on a socket (``ring_failure``: that socket's thread is
gone for good and any collective still to come on it would wait forever, so the runner is
failed at once; docs/architecture.md#rules, runner supervision).

The relay is pure bookkeeping (``feed`` / ``close`` with a clock you pass in), so it is
tested without processes; the supervisor owns the pipe.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

MAX_LINE_CHARS = 4096
"""Characters of one runner output line kept in its record (the rest is cut)."""
MAX_LINES_PER_SECOND = 100
"""Runner output lines written per second at most; beyond that they are counted."""
RING_GAVE_UP = ("[ring] Too many send/recv errors",)
"""How MLX's ring backend says it stopped a socket's thread after repeated errors (its
pending collectives fail, later ones on that socket never end)."""


def ring_failure(line: str) -> str | None:
    """``line`` (a runner's output line) when it says MLX's ring gave up on a socket, cut to
    200 characters; None otherwise."""
    return line.strip()[:200] if any(marker in line for marker in RING_GAVE_UP) else None


class OutputRelay:
    """Turns the bytes of a runner's fds 1/2 into JSON lines given to ``write``.

    ``write(text)`` receives whole lines ending in a newline. ``fields`` are added to every
    wrapped record (``runner_id``, ``pid``, ``node``). ``clock()`` is seconds (monotonic).
    ``raw``: lines pass unchanged (the console format); ``on_line(text)`` sees every line.
    """

    def __init__(
        self,
        write: Callable[[str], None],
        fields: dict[str, object],
        *,
        max_lines_per_second: int = MAX_LINES_PER_SECOND,
        clock: Callable[[], float] = time.monotonic,
        raw: bool = False,
        on_line: Callable[[str], None] | None = None,
    ) -> None:
        self._write = write
        self._raw = raw
        self._on_line = on_line
        self._fields = dict(fields)
        self._limit = max_lines_per_second
        self._clock = clock
        self._partial = b""
        self._window = -1
        self._written = 0
        self.suppressed = 0
        """Lines not written because of the rate limit (all time)."""
        self._unsaid = 0

    def feed(self, data: bytes) -> None:
        """Bytes as read from the pipe (any split); complete lines are relayed."""
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        if len(self._partial) > MAX_LINE_CHARS * 4:  # no newline for a long time: relay a piece
            lines.append(self._partial)
            self._partial = b""
        for raw in lines:
            self._line(raw)

    def close(self) -> None:
        """The pipe ended: relay a last line without its newline and say what was dropped."""
        if self._partial:
            self._line(self._partial)
            self._partial = b""
        self._say_suppressed()

    def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace").rstrip("\r")
        if not text.strip():
            return
        if self._on_line is not None:
            self._on_line(text)
        window = int(self._clock())
        if window != self._window:
            self._window, self._written = window, 0
            self._say_suppressed()
        if self._written >= self._limit:
            self.suppressed += 1
            self._unsaid += 1
            return
        self._written += 1
        self._write(text[:MAX_LINE_CHARS] + "\n" if self._raw else _as_json_line(text, self._fields))

    def _say_suppressed(self) -> None:
        if self._unsaid:
            record = {"event": "runner output suppressed", "lines": self._unsaid, "level": "warning",
                      "timestamp": _now(), **self._fields}
            self._unsaid = 0
            self._write(f"runner output suppressed: {record['lines']} lines\n" if self._raw else json.dumps(record) + "\n")


def _as_json_line(text: str, fields: dict[str, object]) -> str:
    stripped = text.strip()
    if stripped.startswith("{") and stripped.endswith("}"):
        try:
            if isinstance(json.loads(stripped), dict):
                return stripped + "\n"
        except ValueError:
            pass
    record = {"event": "runner output", "line": text[:MAX_LINE_CHARS], "stream": "fd",
              "level": "warning", "timestamp": _now(), **fields}
    return json.dumps(record) + "\n"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
