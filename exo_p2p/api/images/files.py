"""Generated images served by URL (``response_format: url``) for a bounded time
(docs/images.md#api, docs/security.md): kept in this API node's memory, each under an
unguessable name, dropped ``FILE_TTL`` seconds after it was made or when the store is over
``MAX_FILES`` or ``MAX_FILE_BYTES`` (oldest first). Nothing is written to disk or replicated.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict

FILE_TTL = 600.0
"""Seconds a generated image stays fetchable by its URL."""
MAX_FILES = 64
"""Images the store holds at most."""
MAX_FILE_BYTES = 256 * 1024 * 1024
"""Bytes the store holds at most."""


class ImageFiles:
    """The store (module docstring); ``clock`` gives seconds (monotonic)."""

    def __init__(self, clock=time.monotonic) -> None:  # type: ignore[no-untyped-def]
        self._clock = clock
        self._files: OrderedDict[str, tuple[float, str, bytes]] = OrderedDict()

    def _expire(self) -> None:
        now = self._clock()
        while self._files:
            name, (made, _, data) = next(iter(self._files.items()))
            if now - made <= FILE_TTL and len(self._files) <= MAX_FILES and self.bytes <= MAX_FILE_BYTES:
                return
            del self._files[name]

    @property
    def bytes(self) -> int:
        return sum(len(d) for _, _, d in self._files.values())

    def put(self, data: bytes, extension: str, media_type: str) -> str:
        """Keep ``data`` and return its file name (``<random>.<extension>``)."""
        name = f"{secrets.token_urlsafe(24)}.{extension}"
        self._files[name] = (self._clock(), media_type, data)
        self._expire()
        return name

    def get(self, name: str) -> tuple[str, bytes] | None:
        """``(media type, bytes)`` of file ``name`` while it is kept, else None."""
        self._expire()
        entry = self._files.get(name)
        return None if entry is None else (entry[1], entry[2])
