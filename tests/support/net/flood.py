"""Careless and hostile TCP clients for the flood tests: idle connections, slowloris heads and
bodies, and a ``/health`` probe timed while they hold the node's ports.

``run_flood(plan, hold, probe_port)`` opens every connection of ``plan`` in random order (at
most ``CONNECTS_IN_FLIGHT`` connects at once, ``CONNECTS_PER_SECOND``) and keeps each until
the server closes it or ``hold`` seconds pass, in a process of its own, while the caller's
process asks ``GET /health`` every ``PROBE_EVERY`` s. It returns, per kind, when the server
closed each connection (seconds after it was opened; None: still open at the end), and every
probe's latency (None: no answer within ``PROBE_TIMEOUT`` s)."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parents[3]

CONNECTS_IN_FLIGHT = 200
CONNECTS_PER_SECOND = 500
"""Connections opened per second at most: a 2,400-connection flood opens within ~5 s, all of
it open at once before the first idle ones time out."""
PROBE_EVERY = 0.5
PROBE_TIMEOUT = 3.0
FLOOD_SLACK = 60.0
"""Seconds the flood process may run beyond ``hold`` (opening connections at
``CONNECTS_PER_SECOND``, a loaded machine) before it is killed."""
TRICKLE_EVERY = 2.0
"""Seconds between two bytes of a slowloris client."""

READER_REQUEST = b"GET /dashboard/views.js HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
READER_REQUESTS = 2000
"""Pipelined requests of a "reader" client: ~25 MB of answers, more than loopback buffers hold."""
READER_LOOKS_AFTER = 26.0
"""Seconds after which a "reader" client drains what it was sent, to see whether the server
closed the connection meanwhile (it cannot tell before without reading): the API's
``SEND_TIMEOUT`` (20 s) after its buffers filled, plus slack."""
HEAD_START = b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
BODY_HEAD = HEAD_START + b"content-type: application/json\r\ncontent-length: 100000\r\n\r\n{"


@dataclass(frozen=True)
class Wave:
    """``count`` connections of ``kind`` to ``port``: "idle" (say nothing), "head" (a request
    head one header line every ``TRICKLE_EVERY`` s), "body" (a whole head, then one body byte
    every ``TRICKLE_EVERY`` s), "h2" (the HTTP/2 prior-knowledge preface, then nothing),
    "reader" (``READER_REQUESTS`` pipelined requests for a static file, never reading an
    answer until ``READER_LOOKS_AFTER`` s have passed)."""

    kind: str
    port: int
    count: int


@dataclass
class FloodResult:
    """Per "kind:port": seconds after which the server closed each connection (None: it did
    not), connects that failed, the first bytes the server sent; the probes' latencies (or
    why a probe got no answer, ``probe_health``) and the server's largest descriptor count seen."""

    closed_after: dict[str, list[float | None]] = field(default_factory=dict)
    connect_failures: dict[str, int] = field(default_factory=dict)
    probes: list[float | str] = field(default_factory=list)
    first_bytes: dict[str, set[bytes]] = field(default_factory=dict)
    peak_fds: int = 0


async def _trickle(stream: trio.SocketStream, kind: str) -> None:
    if kind in ("idle", "h2"):
        if kind == "h2":
            await stream.send_all(H2_PREFACE)
        await trio.sleep_forever()
    await stream.send_all(BODY_HEAD if kind == "body" else HEAD_START)
    while True:
        await trio.sleep(TRICKLE_EVERY)
        await stream.send_all(b"x" if kind == "body" else b"x-slow: 1\r\n")


async def _reader(stream: trio.SocketStream) -> float | None:
    """A "reader" client: seconds after which it saw the server's close, or None."""
    import socket

    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    opened = time.monotonic()
    with trio.move_on_after(5):
        await stream.send_all(READER_REQUEST * READER_REQUESTS)
    await trio.sleep(READER_LOOKS_AFTER - (time.monotonic() - opened))
    with trio.move_on_after(5):
        try:
            while await stream.receive_some(1 << 20):
                pass
        except (trio.BrokenResourceError, OSError):
            pass
        return time.monotonic() - opened
    return None


async def _one(wave: Wave, key: str, result: FloodResult, hold: float, connects: trio.CapacityLimiter) -> None:
    async with connects:
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", wave.port)
        except OSError:
            result.connect_failures[key] = result.connect_failures.get(key, 0) + 1
            return
    if wave.kind == "reader":
        async with stream:
            result.closed_after.setdefault(key, []).append(await _reader(stream))
        return
    opened = time.monotonic()
    closed: float | None = None
    async with stream:
        with trio.move_on_after(hold):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_trickle_quietly, stream, wave.kind)
                try:
                    first = await stream.receive_some(16)
                    result.first_bytes.setdefault(key, set()).add(first[:12])
                    while await stream.receive_some(65536):
                        pass
                except (trio.BrokenResourceError, OSError):
                    pass
                closed = time.monotonic() - opened
                nursery.cancel_scope.cancel()
    result.closed_after.setdefault(key, []).append(closed)


async def _trickle_quietly(stream: trio.SocketStream, kind: str) -> None:
    try:
        await _trickle(stream, kind)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        await trio.sleep_forever()  # the reader sees the close


async def _flood(plan: list[Wave], hold: float, result: FloodResult) -> None:
    connects = trio.CapacityLimiter(CONNECTS_IN_FLIGHT)
    waves = [wave for wave in plan for _ in range(wave.count)]
    random.Random(0).shuffle(waves)  # every port and kind from the first second on
    async with trio.open_nursery() as clients:
        for wave in waves:
            clients.start_soon(_one, wave, f"{wave.kind}:{wave.port}", result, hold, connects)
            await trio.sleep(1 / CONNECTS_PER_SECOND)


def probe_health(port: int) -> float | str:
    """Seconds ``GET /health`` on ``port`` took to a whole 200 answer (a blocking socket: no
    client library's own time in it), or why it got none: ``"timeout"`` (no whole answer
    within ``PROBE_TIMEOUT`` s: slow, e.g. a connect whose SYN waited out a full accept
    queue on a machine short of CPU), ``"refused"``, ``"reset"``, ``"closed"`` (no bytes) or
    the status line of another answer."""
    started = time.monotonic()
    data = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
            while (part := sock.recv(65536)) and time.monotonic() - started < PROBE_TIMEOUT:
                data += part
    except TimeoutError:
        return "timeout"
    except ConnectionRefusedError:
        return "refused"
    except OSError as exc:
        return f"reset ({exc.__class__.__name__})"
    took = time.monotonic() - started
    if took >= PROBE_TIMEOUT:
        return "timeout"
    if not data.startswith(b"HTTP/1.1 200"):
        return data.split(b"\r\n", 1)[0].decode("latin-1") or "closed"
    return took


def probe_failures(probes: list[float | str]) -> list[str]:
    """The probes that got an answer other than 200 or none at all (a timeout is slow, not
    failed: the share of quick probes bounds those)."""
    return [p for p in probes if isinstance(p, str) and p != "timeout"]


def quick_share(probes: list[float | str], bound: float) -> float:
    """Share of ``probes`` answered 200 within ``bound`` s (0.0 for none)."""
    return sum(isinstance(p, float) and p < bound for p in probes) / max(1, len(probes))


def run_flood(plan: list[Wave], hold: float, probe_port: int, fds: Callable[[], int] = lambda: 0) -> FloodResult:
    """Run the flood of ``plan`` in a process of its own (see the module docstring; its CPU
    does not delay the probes) and probe ``/health`` on ``probe_port`` meanwhile; blocks until
    every connection is closed (by the server, or by the client after ``hold`` s). ``fds()``
    (the server's open descriptors) is read at each probe; its largest value is ``peak_fds``."""
    with tempfile.TemporaryDirectory() as tmp:
        out_path = Path(tmp) / "flood.json"  # not a pipe: the child would block on a full one
        spec = json.dumps({"plan": [[w.kind, w.port, w.count] for w in plan], "hold": hold, "out": str(out_path)})
        flood = subprocess.Popen([sys.executable, "-m", "tests.support.net.flood", spec], cwd=REPO)
        probes, peak = [], 0
        deadline = time.monotonic() + hold + FLOOD_SLACK
        try:
            while flood.poll() is None and time.monotonic() < deadline:
                probes.append(probe_health(probe_port))
                peak = max(peak, fds())
                time.sleep(PROBE_EVERY)
        finally:
            if flood.poll() is None:
                flood.kill()
            flood.wait()
        out = json.loads(out_path.read_text())
    return FloodResult(out["closed_after"], out["connect_failures"], probes,
                       {k: {b.encode("latin-1") for b in v} for k, v in out["first_bytes"].items()}, peak)


def main(spec: str) -> None:
    """The flood process: run ``spec`` (JSON: plan, hold, out), write the result as JSON to
    the file ``out``."""
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    args = json.loads(spec)
    result = FloodResult()
    trio.run(_flood, [Wave(*w) for w in args["plan"]], args["hold"], result)
    Path(args["out"]).write_text(json.dumps({
        "closed_after": result.closed_after, "connect_failures": result.connect_failures,
        "first_bytes": {k: sorted(b.decode("latin-1") for b in v) for k, v in result.first_bytes.items()}}))


if __name__ == "__main__":
    main(sys.argv[1])
