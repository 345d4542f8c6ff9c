"""Length-prefixed frames over a libp2p stream.

A frame is a 4-byte big-endian unsigned length followed by that many bytes. A response frame's
payload starts with one status byte (``STATUS_OK`` or ``STATUS_ERROR``; the rest of an error
payload is a UTF-8 message). Reads loop until the whole frame arrived (``stream.read(n)``
returns *up to* n bytes); writes go in chunks of ``WRITE_CHUNK`` bytes (docs/architecture.md#networking-notes, note 12).
"""

from __future__ import annotations

import struct
from typing import Protocol

from libp2p.network.stream.exceptions import StreamEOF

HEADER = struct.Struct(">I")
WRITE_CHUNK = 1024 * 1024
READ_CHUNK = 1024 * 1024
STATUS_OK = 0
STATUS_ERROR = 1


class FrameError(Exception):
    """The peer sent something that is not a valid frame (closed early, or too large)."""


class FrameTooLarge(FrameError):
    """A frame longer than the configured maximum (bytes) was announced or asked for."""


class _Stream(Protocol):
    async def read(self, n: int | None = None) -> bytes: ...
    async def write(self, data: bytes) -> None: ...


async def read_exactly(stream: _Stream, n: int) -> bytes:
    """Read exactly ``n`` bytes. Raises FrameError if the stream ends first."""
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = await stream.read(min(n - len(buf), READ_CHUNK))
        except StreamEOF as exc:
            raise FrameError(f"stream ended after {len(buf)} of {n} bytes") from exc
        if not chunk:
            raise FrameError(f"stream ended after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


async def read_frame(stream: _Stream, max_bytes: int) -> bytes:
    """Read one frame. Raises FrameTooLarge if it announces more than ``max_bytes``."""
    (length,) = HEADER.unpack(await read_exactly(stream, HEADER.size))
    if length > max_bytes:
        raise FrameTooLarge(f"frame of {length} bytes exceeds the limit of {max_bytes}")
    return await read_exactly(stream, length)


async def write_frame(stream: _Stream, payload: bytes, max_bytes: int) -> None:
    """Write one frame. Raises FrameTooLarge (before writing anything) above ``max_bytes``."""
    if len(payload) > max_bytes:
        raise FrameTooLarge(f"frame of {len(payload)} bytes exceeds the limit of {max_bytes}")
    view = memoryview(payload)
    first = min(len(view), WRITE_CHUNK - HEADER.size)
    await stream.write(HEADER.pack(len(payload)) + bytes(view[:first]))
    for start in range(first, len(view), WRITE_CHUNK):
        await stream.write(bytes(view[start : start + WRITE_CHUNK]))
