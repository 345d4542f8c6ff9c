"""Careless and hostile TCP clients for the flood tests: idle connections, slowloris heads and
bodies, and a ``/health`` probe timed while they hold the node's ports.

``run_flood(plan, hold, probe_port)`` opens every connection of ``plan`` (at most
``CONNECTS_IN_FLIGHT`` connects at once), keeps each until the server closes it or ``hold``
seconds pass, and meanwhile asks ``GET /health`` every ``PROBE_EVERY`` s. It returns, per
kind, when the server closed each connection (seconds after it was opened; None: still open
at the end), and every probe's latency (None: no answer within ``PROBE_TIMEOUT`` s)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import trio

CONNECTS_IN_FLIGHT = 200
PROBE_EVERY = 0.5
PROBE_TIMEOUT = 3.0
TRICKLE_EVERY = 2.0
"""Seconds between two bytes of a slowloris client."""

HEAD_START = b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
BODY_HEAD = HEAD_START + b"content-type: application/json\r\ncontent-length: 100000\r\n\r\n{"


@dataclass(frozen=True)
class Wave:
    """``count`` connections of ``kind`` to ``port``: "idle" (say nothing), "head" (a request
    head one header line every ``TRICKLE_EVERY`` s), "body" (a whole head, then one body byte
    every ``TRICKLE_EVERY`` s)."""

    kind: str
    port: int
    count: int


@dataclass
class FloodResult:
    closed_after: dict[str, list[float | None]] = field(default_factory=dict)
    connect_failures: dict[str, int] = field(default_factory=dict)
    probes: list[float | None] = field(default_factory=list)
    first_bytes: dict[str, set[bytes]] = field(default_factory=dict)


async def _trickle(stream: trio.SocketStream, kind: str) -> None:
    if kind == "idle":
        await trio.sleep_forever()
    await stream.send_all(BODY_HEAD if kind == "body" else HEAD_START)
    while True:
        await trio.sleep(TRICKLE_EVERY)
        await stream.send_all(b"x" if kind == "body" else b"x-slow: 1\r\n")


async def _one(wave: Wave, key: str, result: FloodResult, hold: float, connects: trio.CapacityLimiter) -> None:
    async with connects:
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", wave.port)
        except OSError:
            result.connect_failures[key] = result.connect_failures.get(key, 0) + 1
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


async def probe_health(port: int) -> float | None:
    """Seconds ``GET /health`` on ``port`` took to a whole 200 answer; None when it failed or
    took more than ``PROBE_TIMEOUT`` s."""
    started = time.monotonic()
    with trio.move_on_after(PROBE_TIMEOUT):
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
                data = b""
                while part := await stream.receive_some(65536):
                    data += part
        except (OSError, trio.BrokenResourceError):
            return None
        return time.monotonic() - started if data.startswith(b"HTTP/1.1 200") else None
    return None


async def _flood(plan: list[Wave], hold: float, probe_port: int, result: FloodResult) -> None:
    connects = trio.CapacityLimiter(CONNECTS_IN_FLIGHT)
    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as clients:
            for wave in plan:
                for _ in range(wave.count):
                    clients.start_soon(_one, wave, f"{wave.kind}:{wave.port}", result, hold, connects)
            while clients.child_tasks:
                result.probes.append(await probe_health(probe_port))
                await trio.sleep(PROBE_EVERY)
        nursery.cancel_scope.cancel()


def run_flood(plan: list[Wave], hold: float, probe_port: int) -> FloodResult:
    """Run the flood of ``plan`` (see the module docstring); blocks until every connection is
    closed (by the server, or by the client after ``hold`` s)."""
    result = FloodResult()
    trio.run(_flood, plan, hold, probe_port, result)
    return result
