"""Whole messages on yamux streams (``exo_p2p.net.yamux_guard``): two writers of one stream
do not interleave their frames, and a write that fails part-way resets the stream instead of
leaving half a message in it. py-libp2p's ``YamuxStream`` over a fake connection that records
the frames (trio's mock clock: the 5 s window wait passes at once)."""

from __future__ import annotations

import struct

import pytest
import trio
import trio.testing
from libp2p.stream_muxer.exceptions import MuxedStreamError
from libp2p.stream_muxer.yamux.yamux import FLAG_RST, HEADER_SIZE, YAMUX_HEADER_FORMAT, YamuxStream

from exo_p2p.net import yamux_guard

KIB = 1024


class FakeConn:
    """What a ``YamuxStream`` asks of its connection: frames out, RTT, stream bookkeeping."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    async def _write_frame(self, data: bytes) -> None:
        await trio.sleep(0)  # a real connection's send yields: another writer may run
        self.frames.append(data)

    def rtt(self) -> float:
        return 0.01

    async def _finalize_stream(self, stream: object, fully_closed: bool = False) -> None:
        return None

    def payloads(self) -> list[bytes]:
        return [f[HEADER_SIZE:] for f in self.frames if struct.unpack(YAMUX_HEADER_FORMAT, f[:HEADER_SIZE])[2] & FLAG_RST == 0]


def _run(test) -> None:  # type: ignore[no-untyped-def]
    yamux_guard.install()
    trio.run(test, clock=trio.testing.MockClock(autojump_threshold=0))


def test_two_writers_of_one_stream_send_whole_messages() -> None:
    async def test() -> None:
        conn = FakeConn()
        stream = YamuxStream(1, conn, True)  # type: ignore[arg-type]
        stream.send_window = 10 * 1024 * KIB
        a, b = b"a" * 150 * KIB, b"b" * 150 * KIB  # three frames each
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream.write, a)
            nursery.start_soon(stream.write, b)
        assert b"".join(conn.payloads()) in (a + b, b + a)

    _run(test)


def test_a_write_that_fails_part_way_resets_the_stream() -> None:
    async def test() -> None:
        conn = FakeConn()
        stream = YamuxStream(1, conn, True)  # type: ignore[arg-type]
        stream.send_window = 100 * KIB  # the peer opens no more: the write waits 5 s, then fails
        before = yamux_guard.resets()
        with pytest.raises(MuxedStreamError, match="window update"):
            await stream.write(b"x" * 150 * KIB)
        assert len(b"".join(conn.payloads())) == 100 * KIB, "part of the message left"
        rst = [f for f in conn.frames if struct.unpack(YAMUX_HEADER_FORMAT, f[:HEADER_SIZE])[2] & FLAG_RST]
        assert len(rst) == 1 and stream.closed, "the peer is told: a reset, not a stream with half a message"
        assert yamux_guard.resets() == before + 1
        with pytest.raises(MuxedStreamError):
            await stream.write(b"next")  # nothing more goes into that stream

    _run(test)
