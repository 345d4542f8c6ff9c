"""The record of every finished request: one structured log line (``request.finished``), one
line of a rotating JSONL file, and the recent records ``GET /requests`` serves to
``exo-p2p logs requests`` (docs/operations.md).

Bounded: the file rotates at ``max_bytes`` into ``requests.jsonl.1`` (one older file kept,
so at most 2 × ``max_bytes`` on disk); the recent records are the last ``RECENT`` ones. A
file that cannot be written is logged once and given up: a full disk never fails a request.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import msgspec
import structlog

from exo_p2p.types.observe import RequestRecord

log = structlog.get_logger("exo_p2p.requests")

RECENT = 1024
"""Records kept in memory for ``GET /requests``."""
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
"""Bytes of ``requests.jsonl`` before it rotates (``--request-log-bytes``)."""
FILE_NAME = "requests.jsonl"

_json = msgspec.json.Encoder()


class RequestLog:
    """Where finished requests' records go. ``path``: the JSONL file (None: no file);
    ``max_bytes``: its size before it rotates (> 0)."""

    def __init__(self, path: Path | None = None, max_bytes: int = DEFAULT_MAX_BYTES, recent: int = RECENT) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, not {max_bytes}")
        self.path = path
        self.max_bytes = max_bytes
        self._recent: deque[tuple[int, RequestRecord]] = deque(maxlen=recent)
        self.count = 0
        """Records written since the node started (the sequence number of the last one)."""
        self._size = path.stat().st_size if path is not None and path.exists() else 0

    def write(self, record: RequestRecord) -> None:
        """Log ``record``, append it to the file (rotating first when it would exceed
        ``max_bytes``) and keep it among the recent ones."""
        self.count += 1
        self._recent.append((self.count, record))
        fields = {k: v for k, v in msgspec.structs.asdict(record).items() if v is not None and k not in ("prompt", "output")}
        log.info("request.finished", **fields)
        if self.path is not None:
            self._append(_json.encode(record) + b"\n")

    def _append(self, line: bytes) -> None:
        assert self.path is not None
        try:
            if self._size and self._size + len(line) > self.max_bytes:
                self.path.replace(self.path.with_name(self.path.name + ".1"))
                self._size = 0
            with self.path.open("ab") as f:
                f.write(line)
            self._size += len(line)
        except OSError as exc:
            log.warning("request log not writable; records go to the log only", path=str(self.path), error=str(exc))
            self.path = None

    def since(self, after: int, limit: int = RECENT) -> tuple[list[RequestRecord], int]:
        """The recent records numbered after ``after`` (oldest first, at most ``limit``) and
        the number of the last one returned (``after`` when none)."""
        out = [(n, r) for n, r in self._recent if n > after][:max(0, limit)]
        return [r for _, r in out], (out[-1][0] if out else after)
