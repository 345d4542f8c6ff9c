"""The on-disk event log: append-only, length-prefixed msgpack frames with a checksum each.

Frame layout (little-endian): ``u32 payload_length | u32 crc32(payload) | payload``, where the
payload is the msgpack of one ``IndexedEvent``. A crash can leave a torn last frame (short
header, short payload or wrong checksum); opening the log truncates it, so a restarted node
reads back exactly the events that were fully written. A bad frame *before* the last one is
corruption, not a torn write: it is also truncated (with everything after it) and reported.
"""

from __future__ import annotations

import errno
import os
import shutil
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import msgspec
import structlog

from exo_p2p.types import IndexedEvent

log = structlog.get_logger(__name__)

_HEADER = struct.Struct("<II")
MAX_FRAME_BYTES = 64 * 1024 * 1024
"""A frame larger than this (64 MiB) is treated as corruption."""

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(IndexedEvent)


def encode_frame(event: IndexedEvent) -> bytes:
    """One frame: header (length, crc32) + msgpack payload."""
    payload = _encoder.encode(event)
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def scan_frames(data: bytes) -> tuple[list[IndexedEvent], int]:
    """Decode frames from ``data``; returns the events and the byte offset after the last
    good frame (where a torn or corrupt tail starts, or ``len(data)``)."""
    events, _sizes, pos = _scan(data)
    return events, pos


def _scan(data: bytes) -> tuple[list[IndexedEvent], list[int], int]:
    """``scan_frames`` with each good frame's size in bytes (header included)."""
    events: list[IndexedEvent] = []
    sizes: list[int] = []
    pos = 0
    while pos + _HEADER.size <= len(data):
        length, crc = _HEADER.unpack_from(data, pos)
        end = pos + _HEADER.size + length
        if length > MAX_FRAME_BYTES or end > len(data):
            break
        payload = data[pos + _HEADER.size : end]
        if zlib.crc32(payload) != crc:
            break
        try:
            events.append(_decoder.decode(payload))
        except msgspec.DecodeError:
            break
        sizes.append(end - pos)
        pos = end
    return events, sizes, pos


class EventLog:
    """An append-only log of indexed events in one file.

    ``EventLog(path)`` opens (creating) the file, truncates a torn tail and loads the
    events; ``events`` holds them in file order, ``sizes`` each one's frame in bytes (header
    included) and ``bytes`` their sum, the file's length. ``append`` writes one frame and, with
    ``sync=True``, fsyncs so the event survives a crash (docs/architecture.md#log-guarantees: in a one-node cluster
    an event is committed once persisted). Not safe for use by two processes at once.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        data = path.read_bytes() if path.exists() else b""
        self.events, self.sizes, good = _scan(data)
        self.bytes = good
        if good != len(data):
            log.warning("event log tail truncated", path=str(path), dropped_bytes=len(data) - good, kept_events=len(self.events))
            with open(path, "r+b") as f:
                f.truncate(good)
                f.flush()
                os.fsync(f.fileno())
        self._file = open(path, "ab")

    def __iter__(self) -> Iterator[IndexedEvent]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def append(self, event: IndexedEvent, *, sync: bool = True) -> None:
        """Append one event (written and flushed to the OS; fsynced when ``sync``). Appending
        several with ``sync=False`` and then calling ``sync()`` once is a group commit: each
        survives a crash of this process at once, a crash of the machine after ``sync()``.

        Raises ``OSError`` naming the log's path (a full disk: the event is not in
        ``events``; the file may end in a torn frame, which the next open truncates)."""
        frame = encode_frame(event)
        try:
            self._file.write(frame)
            self._file.flush()
            if sync:
                os.fsync(self._file.fileno())
        except OSError as exc:
            raise self._error(exc) from exc
        self.events.append(event)
        self.sizes.append(len(frame))
        self.bytes += len(frame)

    def sync(self) -> None:
        """fsync what was appended so far (one disk flush for any number of appends).
        Raises ``OSError`` naming the log's path."""
        try:
            os.fsync(self._file.fileno())
        except OSError as exc:
            raise self._error(exc) from exc

    def _error(self, exc: OSError) -> OSError:
        """The error naming the log; on a full disk (``ENOSPC``, ``EDQUOT``) also the free bytes
        and why the node stops: it never applies an event it cannot keep, since the master
        counts an applied event as committed on its word (docs/security.md)."""
        text = f"cannot write the event log: {exc.strerror or exc}"
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            try:
                free = shutil.disk_usage(self.path.parent).free
            except OSError:
                free = 0
            text += (f" ({free} bytes free in {self.path.parent}); this node stops, as it cannot keep the events it "
                     f"would apply: free space there (remove models under models/.fetched, or move the data dir) "
                     f"and start it again")
        return OSError(exc.errno, text, str(self.path))

    def truncate_after(self, idx: int) -> None:
        """Drop every event with index > ``idx`` (used when a node's tail diverges from the
        master's log, docs/architecture.md#log-guarantees)."""
        keep = [e for e in self.events if e.idx <= idx]
        if len(keep) == len(self.events):
            return
        self._file.close()
        tmp = self.path.with_suffix(".tmp")
        frames = [encode_frame(e) for e in keep]
        with open(tmp, "wb") as f:
            for frame in frames:
                f.write(frame)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self.events = keep
        self.sizes = [len(frame) for frame in frames]
        self.bytes = sum(self.sizes)
        self._file = open(self.path, "ab")

    def clear(self) -> None:
        """Drop every event (after a snapshot made them redundant)."""
        self.truncate_after(-1)

    def close(self) -> None:
        """Close the file. A buffered tail that cannot be written (the disk is full) is
        dropped with a warning, not raised: the error that stopped the node was reported
        when it happened, and the next open truncates a torn frame."""
        try:
            self._file.close()
        except OSError as exc:
            log.warning("event log closed with an unwritten tail", path=str(self.path), error=str(exc))
