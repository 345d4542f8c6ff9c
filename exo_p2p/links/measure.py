"""One measurement of one address of a peer, over a probe connection (docs/links.md).

``measure`` connects to ``ip:port`` (the peer's probe listener, ``exo_p2p.links.probe_server``),
proves the ticket, times ``PROBES`` small round trips (their median is the RTT) and, when asked,
a bounded transfer: chunks from 64 KiB doubling until one takes at least ``TIMED_SECONDS`` or
the next would exceed ``BANDWIDTH_BYTES``; the bandwidth is the last chunk's bytes over its
time less one RTT (its acknowledgement). Every step is under a deadline.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable

import trio

from exo_p2p.links.figures import BANDWIDTH_BYTES, BANDWIDTH_SECONDS, PROBE_BYTES, PROBES, median_rtt_us, throughput
from exo_p2p.links.probe_server import ProbeClosed, receive_exactly

CONNECT_TIMEOUT = 3.0
"""Seconds a probe connection may take to open (and to prove the ticket)."""
PROBE_TIMEOUT = 2.0
"""Seconds one small round trip may take."""
FIRST_CHUNK = 64 << 10
TIMED_SECONDS = 0.25
"""A transfer chunk that lasts this long is long enough to time."""

_PAYLOAD = bytes(BANDWIDTH_BYTES)


class Unreachable(ConnectionError):
    """The address did not accept a connection: the link (or that address) is down."""


class Inconclusive(ConnectionError):
    """A connection opened but the probe did not complete (wrong node, busy, closed)."""


async def measure(ip: str, port: int, token: bytes, proof: bytes, *, bandwidth: Callable[[int], bool],
                  clock=time.perf_counter) -> tuple[int, int | None]:  # type: ignore[no-untyped-def]
    """``(rtt_us, bytes_per_s or None)`` of ``ip`` (quantised, ``exo_p2p.links.figures``); the
    bandwidth is measured when ``bandwidth(rtt_us)`` says so, on the same connection.

    Raises ``Unreachable`` when no connection opens within ``CONNECT_TIMEOUT``, ``Inconclusive``
    when the peer does not answer the ticket's proof or a probe fails midway."""
    try:
        with trio.fail_after(CONNECT_TIMEOUT):
            stream = await trio.open_tcp_stream(ip, port)
    except (OSError, trio.TooSlowError) as exc:
        raise Unreachable(f"{ip}:{port}: {exc!r}") from exc
    try:
        async with stream:
            with trio.fail_after(CONNECT_TIMEOUT):
                await stream.send_all(token)
                if await receive_exactly(stream, len(proof)) != proof:
                    raise Inconclusive(f"{ip}:{port} did not prove the ticket")
            samples = []
            probe = b"p" + bytes(PROBE_BYTES)
            for _ in range(PROBES):
                start = clock()
                with trio.fail_after(PROBE_TIMEOUT):
                    await stream.send_all(probe)
                    await receive_exactly(stream, PROBE_BYTES)
                samples.append(clock() - start)
            rtt_us = median_rtt_us(samples)
            return rtt_us, (await _bandwidth(stream, rtt_us, clock) if bandwidth(rtt_us) else None)
    except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, ProbeClosed, OSError) as exc:
        raise Inconclusive(f"{ip}:{port}: {exc!r}") from exc


async def _bandwidth(stream: trio.SocketStream, rtt_us: int, clock) -> int:  # type: ignore[no-untyped-def]
    """Bytes/s of the timed transfer (module docstring); a chunk that does not finish within
    ``BANDWIDTH_SECONDS`` gives at most its bytes over that time."""
    size = FIRST_CHUNK
    view = memoryview(_PAYLOAD)
    while True:
        start = clock()
        with trio.move_on_after(BANDWIDTH_SECONDS) as late:
            await stream.send_all(b"b" + struct.pack(">I", size))
            await stream.send_all(view[:size])
            if await receive_exactly(stream, 1) != b"k":
                raise ProbeClosed("no acknowledgement of a transfer")
        if late.cancelled_caught:
            return throughput(size, BANDWIDTH_SECONDS)
        took = clock() - start
        if took >= TIMED_SECONDS or size * 2 > BANDWIDTH_BYTES:
            return throughput(size, max(took - rtt_us / 1e6, took / 2))
        size *= 2
