"""The files of one partial copy on disk: its saved manifest and each model file's bytes.

A model file is ``<path>.part`` while chunks are missing (verified chunks at their offsets,
holes elsewhere) and ``<path>`` once every chunk is verified (``finish_file``). These
functions only read, write, sync and rename; which chunks are verified, the lock and the
order of syncs and journal appends are ``exo_p2p.models.copies.partial.PartialModel``'s.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import msgspec

from exo_p2p.types.manifest import ModelManifest

MANIFEST_FILE = ".manifest.json"
"""The copy's manifest, saved before any chunk (its digest names the copy's directory)."""


def claim_dir(root: Path, manifest: ModelManifest) -> None:
    """Create ``root`` and save ``manifest`` in it (written beside, then renamed), or check
    that the manifest saved there is the same. Raises ``ValueError`` when ``root`` holds
    another manifest, or an unreadable one (``msgspec.DecodeError``, a ``ValueError``)."""
    root.mkdir(parents=True, exist_ok=True)
    saved = root / MANIFEST_FILE
    if saved.exists():
        other = msgspec.json.decode(saved.read_bytes(), type=ModelManifest)
        if other.digest != manifest.digest:
            raise ValueError(f"{root} holds manifest {other.digest[:12]}, "
                             f"not {manifest.digest[:12]}")
    else:
        tmp = saved.with_suffix(".tmp")
        tmp.write_bytes(msgspec.json.encode(manifest))
        os.replace(tmp, saved)


def present(root: Path, path: str) -> bool:
    """Whether model file ``path`` is on disk, complete or as its ``.part``."""
    return (root / path).exists() or (root / f"{path}.part").exists()


def open_part(root: Path, path: str) -> int:
    """A descriptor open for writing on ``<path>.part`` (created, with its directories, if
    missing); the caller closes it."""
    part = root / f"{path}.part"
    part.parent.mkdir(parents=True, exist_ok=True)
    return os.open(part, os.O_WRONLY | os.O_CREAT, 0o644)


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """Write every byte of ``data`` at ``offset``: ``pwrite`` may write fewer (a file system
    filling up writes what fits and fails only on the next call, which raises ``OSError``)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def read_span(root: Path, path: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of model file ``path`` (complete, else its ``.part``)."""
    target = root / path
    if not target.exists():
        target = root / f"{path}.part"
    with open(target, "rb") as f:
        f.seek(start)
        return f.read(end - start)


def sync_files(root: Path, paths: Iterable[str]) -> None:
    """``fdatasync`` each model file of ``paths`` (its ``.part``, else the complete file), in
    sorted order, once each (blocking)."""
    for path in sorted(set(paths)):
        target = root / f"{path}.part"
        if not target.exists():
            target = root / path
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)


def finish_file(root: Path, path: str, size: int) -> None:
    """Rename ``<path>.part`` to ``<path>``, its length set to ``size`` bytes (an empty one
    is created first when missing); nothing when ``<path>`` exists already."""
    part, final = root / f"{path}.part", root / path
    if final.exists():
        return
    final.parent.mkdir(parents=True, exist_ok=True)
    if not part.exists():
        part.touch()
    os.truncate(part, size)
    os.replace(part, final)


def delete_file(root: Path, path: str) -> None:
    """Delete model file ``path``, complete and ``.part`` (missing ones are fine)."""
    (root / path).unlink(missing_ok=True)
    (root / f"{path}.part").unlink(missing_ok=True)
