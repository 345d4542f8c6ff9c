"""Messages between a worker's supervisor and its runner subprocess.

Frames are ``u32 length (little-endian) | msgpack``, on two dedicated pipes (file
descriptors passed to the runner), never on stdout/stderr, which libraries may write to.
Supervisor → runner: ``RunnerSetup`` first, then ``Task``s. Runner → supervisor:
``ToSupervisor`` messages; every message counts as a sign of life, and ``HeartbeatMsg``
(from a thread of its own, ``worker.runner.pulse``) also says what the runner is busy with.
"""

from __future__ import annotations

import os
import struct

import msgspec

from exo_p2p.types import Chunk, Instance, RunnerStatus, ShardMetadata, Task, TaskId, TaskStatus
from exo_p2p.types.engine import EngineSettings
from exo_p2p.types.observe import EngineStats

INPUT_CLOSED = object()
"""Put on the runner's task queue when its input pipe closes or fails (the node is gone)."""

_LEN = struct.Struct("<I")
MAX_FRAME = 64 * 1024 * 1024


class RunnerSetup(msgspec.Struct, frozen=True, tag="setup", tag_field="kind"):
    """What a runner needs before any task: its instance and shard, the model directory,
    its engine settings (``EngineSettings``: prefill chunk size in tokens, batch limit in
    sequences, prompt cache bound in bytes — on a multi-rank instance the smallest rank's, in
    tokens), the heartbeat interval (seconds), and test fault hooks."""

    instance: Instance
    shard: ShardMetadata
    model_dir: str
    engine: EngineSettings = msgspec.field(default_factory=EngineSettings)
    """The engine's settings (``EngineSettings.for_runner``): the instance's rank settings, and
    in ``kv_cache_bytes`` the resolved budget — bytes of KV cache the runner's batch (and prompt
    cache) may hold, joins are checked against it (``worker.engine.batch_memory``); None: no
    check."""
    heartbeat_interval: float = 1.0
    fault_hooks: dict[str, str] = msgspec.field(default_factory=dict)


class ImageData(msgspec.Struct, frozen=True, tag="image_data", tag_field="kind"):
    """An image's checked bytes (``digest`` their sha256, hex), sent before the task that
    refers to it (``worker.vision.delivery``)."""

    digest: str
    data: bytes


ToRunner = RunnerSetup | ImageData | Task


class StatusMsg(msgspec.Struct, frozen=True, tag="status", tag_field="kind"):
    status: RunnerStatus


class ChunkMsg(msgspec.Struct, frozen=True, tag="chunk", tag_field="kind"):
    chunk: Chunk


class TaskStatusMsg(msgspec.Struct, frozen=True, tag="task_status", tag_field="kind"):
    task_id: TaskId
    status: TaskStatus


class HeartbeatMsg(msgspec.Struct, frozen=True, tag="heartbeat", tag_field="kind"):
    """Sent every ``heartbeat_interval`` seconds by the runner's heartbeat thread
    (``worker.runner.pulse``): ``busy`` the main thread's unit of work ("" waiting for input),
    ``busy_for`` its age in seconds, ``longest_step`` the longest recent engine step in
    seconds (warm-up steps included); the supervisor's stuck rule is ``worker.liveness``.
    ``stats``: the engine's last figures (``worker.runner.stats``; None before warm-up)."""

    busy: str = ""
    busy_for: float = 0.0
    longest_step: float = 0.0
    stats: EngineStats | None = None


class PrefixesMsg(msgspec.Struct, frozen=True, tag="prefixes", tag_field="kind"):
    """The digests of the prefixes rank 0's prompt cache holds now (``exo_p2p.content.prefixes``),
    sent when they changed, after a burst at most every ``worker.runner.stats.PREFIX_MIN_GAP`` seconds."""

    digests: tuple[int, ...]


ToSupervisor = StatusMsg | ChunkMsg | TaskStatusMsg | HeartbeatMsg | PrefixesMsg

_enc = msgspec.msgpack.Encoder()
to_runner_decoder = msgspec.msgpack.Decoder(ToRunner)
to_supervisor_decoder = msgspec.msgpack.Decoder(ToSupervisor)


def frame(message: object) -> bytes:
    payload = _enc.encode(message)
    return _LEN.pack(len(payload)) + payload


def read_exact(fd: int, n: int) -> bytes | None:
    """Read exactly ``n`` bytes from ``fd`` (blocking); None on end of file."""
    parts: list[bytes] = []
    while n:
        part = os.read(fd, n)
        if not part:
            return None
        parts.append(part)
        n -= len(part)
    return b"".join(parts)


def read_frame(fd: int) -> bytes | None:
    """Read one frame's payload from ``fd`` (blocking); None on end of file.
    Raises ``ValueError`` for a frame over ``MAX_FRAME`` bytes."""
    header = read_exact(fd, _LEN.size)
    if header is None:
        return None
    (length,) = _LEN.unpack(header)
    if length > MAX_FRAME:
        raise ValueError(f"frame of {length} bytes exceeds {MAX_FRAME}")
    return read_exact(fd, length)


class FrameTooLarge(ValueError):
    """A frame's length prefix says more than ``MAX_FRAME`` bytes (``length``)."""

    def __init__(self, length: int) -> None:
        super().__init__(f"frame of {length} bytes exceeds {MAX_FRAME}")
        self.length = length


class FrameReader:
    """The supervisor's side of ``read_frame``, for a stream read in pieces of any size:
    ``feed(data)`` returns the payloads of the frames ``data`` completes, in order, and keeps
    the rest of a frame for the next call. Raises ``FrameTooLarge`` for a frame over
    ``MAX_FRAME`` bytes (before buffering it: at most ``MAX_FRAME`` + 4 bytes are held)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        payloads: list[bytes] = []
        while len(self._buf) >= _LEN.size:
            (length,) = _LEN.unpack_from(self._buf)
            if length > MAX_FRAME:
                raise FrameTooLarge(length)
            if len(self._buf) < _LEN.size + length:
                break
            payloads.append(bytes(self._buf[_LEN.size : _LEN.size + length]))
            del self._buf[: _LEN.size + length]
        return payloads


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
