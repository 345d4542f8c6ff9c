"""The checked bytes of recent images, by digest, on the node whose API read them.

The replicated log carries ``ImageRef`` (digest, media type, size), never an image's bytes
(docs/architecture.md#request-flow "Images"). The API node keeps the bytes it checked
(``exo_p2p.vision.image.decode_image``) in an ``ImageStore`` until the node of the runner that
needs them (rank 0 of the instance: it runs the vision tower) has taken them: from this store
when it is the same node, else over ``exo_p2p.vision.peer.IMAGE_PROTOCOL``.

Bounded in entries, bytes and time (docs/security.md "Images in the conversation"): the least
recently used image goes first past ``max_entries`` or ``max_bytes``, and an image neither put
nor read for ``ttl`` seconds is forgotten. A request whose image is gone by the time its runner
asks ends with a clear error (``worker.vision.inbox``), never a wait.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

STORE_ENTRIES = 64
"""Images a node keeps at most (4 requests of the largest allowed, 16 images each)."""
STORE_BYTES = 256 * 1024 * 1024
"""Encoded image bytes a node keeps at most (25 images of the 10 MiB maximum)."""
STORE_SECONDS = 600.0
"""Seconds an image is kept after it was last put or read: longer than a request waits in a
queue (``master.admission``) and than a conversation's next turn usually takes; a turn after
this re-sends the image anyway (clients send the whole conversation)."""


class ImageStore:
    """Image bytes by sha256 digest (hex), LRU, bounded (module docstring). ``clock``:
    seconds, monotonic (tests pass their own). Thread-safe: the API checks images in worker
    threads while the node's loop reads them."""

    def __init__(self, max_entries: int = STORE_ENTRIES, max_bytes: int = STORE_BYTES, ttl: float = STORE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1 or max_bytes < 1 or ttl <= 0:
            raise ValueError("an image store needs max_entries >= 1, max_bytes >= 1 and ttl > 0")
        self.max_entries, self.max_bytes, self.ttl, self.clock = max_entries, max_bytes, ttl, clock
        self._entries: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        with self._lock:
            self._expire()
            return self._bytes

    def put(self, digest: str, data: bytes) -> None:
        """Keep ``data`` under ``digest`` (the most recent), evicting past the bounds; an image
        larger than ``max_bytes`` alone is not kept."""
        with self._lock:
            self._drop(digest)
            if len(data) > self.max_bytes:
                return
            self._entries[digest] = (data, self.clock())
            self._bytes += len(data)
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def get(self, digest: str) -> bytes | None:
        """The bytes of ``digest`` (their time renewed), or None when not held or expired."""
        with self._lock:
            self._expire()
            entry = self._entries.get(digest)
            if entry is None:
                return None
            self._entries[digest] = (entry[0], self.clock())
            self._entries.move_to_end(digest)
            return entry[0]

    def _drop(self, digest: str) -> None:
        entry = self._entries.pop(digest, None)
        if entry is not None:
            self._bytes -= len(entry[0])

    def _expire(self) -> None:
        now = self.clock()
        while self._entries:
            digest, (_, at) = next(iter(self._entries.items()))
            if now - at < self.ttl:
                break
            self._drop(digest)


NODE_IMAGES = ImageStore()
"""This node's store: the API puts every image it checked, the peer protocol and the worker
read it (one per node process)."""
