"""A model repository on disk as a hub would serve it."""

from __future__ import annotations

import hashlib
from pathlib import Path

from exo_p2p.models.hub.client import HubFile


class LocalRepo:
    """A ``HubClient`` look-alike reading a directory (no network): what the code under test
    calls, and the bytes it asked for."""

    def __init__(self, root: Path) -> None:
        self.root, self.repo_id, self.asked = root, "org/tiny", 0
        self.files = {p.name: HubFile(p.name, p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()
                                      if p.suffix == ".safetensors" else "") for p in root.iterdir()}

    def info(self, stop=None):
        return "a" * 40, sorted(self.files.values(), key=lambda f: f.path)

    def get_range(self, path: str, start: int, end: int, stop=None) -> bytes:
        self.asked += end - start
        with open(self.root / path, "rb") as f:
            f.seek(start)
            return f.read(end - start)

    def stream_range(self, path: str, start: int, end: int, sink, stop=None) -> None:
        data = self.get_range(path, start, end)
        for at in range(0, len(data), 5000):  # blocks that do not line up with chunks
            sink(data[at:at + 5000])
