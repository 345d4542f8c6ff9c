"""The on-disk copy of a model being fetched from peers, chunk by chunk (docs/models.md).

Layout of one copy (a directory, one per manifest digest)::

    .manifest.json       the manifest (its digest names the directory)
    <path>.part          a file not yet complete: verified chunks at their offsets, holes elsewhere
    <path>               a file whose every chunk is verified (renamed from <path>.part)
    .verified            journal: one line "<chunk index> <path>" per verified chunk

Write order makes a restart safe: verified chunks are journaled in checkpoints (every
``CHECKPOINT_BYTES`` written or ``CHECKPOINT_SECONDS`` passed, before a file is renamed, and
on ``close``): the files written since the last checkpoint are ``fdatasync``-ed first (a
periodic checkpoint does that outside the copy's lock, so other writers go on meanwhile;
``flush``, ``close`` and a file's rename wait for it), then their journal lines are appended
and the journal is fsync-ed, so every journal line names bytes on disk (a crash loses at
most one checkpoint's worth of chunks, which a resumed fetch asks for again); a torn last
line is ignored, and the next append starts on a new line so the torn piece never joins it.
Nothing is written before it matched the manifest's hash
(``exo_p2p.models.manifest.verify_chunk``: ``ChunkVerificationError`` otherwise), so every
byte the journal covers is verified; and ``shard_view`` hands a loader a directory only when
every chunk the shard needs is in the journal.

Shard views (``shard_view``) are hard links to the copy's files kept outside it, so a rename
or a move of the copy leaves them readable (``exo_p2p.models.copies.shard_views``); the journal's
format and the record of whole-file checks: ``exo_p2p.models.copies.journal``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from exo_p2p.models.copies import journal as chunk_journal
from exo_p2p.models.copies.files import (claim_dir, delete_file, finish_file, open_part, present, pwrite_all, read_span,
                                       sync_files)
from exo_p2p.models.copies.journal import JOURNAL, ends_torn, journal_lines, parse_journal, replace_journal, without_file
from exo_p2p.models.copies.shard_views import VIEWS_DIR, build_shard_view
from exo_p2p.models.manifest import check_manifest, chunk_span, verify_chunk
from exo_p2p.types.manifest import ModelManifest

CHECKPOINT_BYTES = 64 * 1024 * 1024
CHECKPOINT_SECONDS = 0.5
"""Verified bytes / seconds between two journal checkpoints (see module docstring): a crash
refetches at most that much."""


class PartialModel:
    """A copy of ``manifest`` at ``root`` (created if missing; reopened with its journal);
    its shard views live in ``views_dir`` (default ``root.parent/.views/root.name``: outside
    the copy, so moving the copy keeps them; module docstring).

    ``write_chunk`` may run in several threads at once (hashing and writing in parallel; the
    journal and the held set are updated under a lock). Raises ``ValueError`` when ``root``
    holds another manifest, or when ``manifest`` is malformed (``check_manifest``: every
    path it names stays under ``root``, every byte belongs to exactly one chunk).
    """

    def __init__(self, root: Path, manifest: ModelManifest, *, views_dir: Path | None = None) -> None:
        self.root = Path(root)
        self.views_dir = Path(views_dir) if views_dir is not None else self.root.parent / VIEWS_DIR / self.root.name
        self.manifest = check_manifest(manifest)
        claim_dir(self.root, manifest)
        self._held: dict[str, set[int]] = {f.path: set() for f in manifest.files}
        self._lock = threading.Lock()
        self._pending: list[tuple[str, int]] = []  # written, not journaled yet
        self._pending_bytes = 0
        self._syncing = 0  # periodic checkpoints syncing their files outside the lock
        self._synced = threading.Condition(self._lock)
        self._last_checkpoint = time.monotonic()
        self._read_journal()
        journal = self.root / JOURNAL
        # a torn last line (a crash or a full disk mid-append) must not run into the next
        # line: "1" + "5 f" would read as chunk 15 of f; the next append starts a new line
        self._torn = ends_torn(journal)
        self._journal = open(journal, "a", encoding="utf-8")
        for f in manifest.files:  # empty files are complete from the start
            if not f.chunks:
                self._finish_file(f.path)

    def close(self) -> None:
        with self._lock:
            if not self._journal.closed:
                self._checkpoint()
                self._journal.close()

    def flush(self) -> None:
        """Journal every chunk verified so far (a checkpoint now; see module docstring)."""
        with self._lock:
            if not self._journal.closed:
                self._checkpoint()

    def _checkpoint(self) -> None:
        """Make the pending chunks durable, then journal them (caller holds the lock; it
        first waits for the periodic checkpoints syncing outside it: ``_checkpoint_batch``)."""
        while self._syncing:
            self._synced.wait()
        if not self._pending:
            return
        self._sync(self._pending)
        self._append_journal(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        self._last_checkpoint = time.monotonic()

    def _sync(self, chunks: list[tuple[str, int]]) -> None:
        """``fdatasync`` the files holding ``chunks`` (blocking; no lock needed)."""
        sync_files(self.root, (p for p, _ in chunks))

    def _append_journal(self, chunks: list[tuple[str, int]]) -> None:
        """Append one line per chunk to the journal and fsync it (caller holds the lock)."""
        lines = journal_lines(chunks)
        try:
            self._journal.write(("\n" if self._torn else "") + lines)
            self._journal.flush()
            os.fsync(self._journal.fileno())
        except OSError:
            self._torn = True  # some of it may be on disk, cut anywhere
            raise
        self._torn = False

    def _checkpoint_batch(self, batch: list[tuple[str, int]], path: str, index: int) -> None:
        """A periodic checkpoint of ``batch`` (taken from the pending chunks by the writer of
        chunk ``index`` of ``path``): its files are synced outside the lock, so the other
        writers go on meanwhile, then its lines are journaled under it — only for chunks
        still held (a file discarded meanwhile gets none). On ``OSError`` the batch is
        pending again, the writer's own chunk is not held (as when a checkpoint under the
        lock fails), and the error is raised."""
        failure: OSError | None = None
        try:
            self._sync(batch)
        except OSError as exc:
            failure = exc
        with self._lock:
            try:
                if failure is not None:
                    raise failure
                self._append_journal([(p, i) for p, i in batch if i in self._held[p]])
            except OSError:
                self._batch_failed(batch, path, index)
                raise
            finally:
                self._syncing -= 1
                self._synced.notify_all()

    def _batch_failed(self, batch: list[tuple[str, int]], path: str, index: int) -> None:
        """Put a failed batch back among the pending chunks, without the writer's own one."""
        back = [(p, i) for p, i in batch if (p, i) != (path, index) and i in self._held[p]]
        self._held[path].discard(index)
        self._pending[:0] = back
        self._pending_bytes = sum(e - s for s, e in (chunk_span(self.manifest, p, i) for p, i in self._pending))

    def __enter__(self) -> PartialModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read_journal(self) -> None:
        path = self.root / JOURNAL
        if not path.exists():
            return
        text = path.read_text(encoding="utf-8", errors="replace")
        for name, index in parse_journal(text, self.manifest, lambda p: present(self.root, p)):
            self._held[name].add(index)

    # -- what is held -----------------------------------------------------------------------
    def held(self) -> dict[str, tuple[int, ...]]:
        """Verified chunks: path -> sorted indices (files with none are left out)."""
        return {p: tuple(sorted(s)) for p, s in self._held.items() if s}

    def has(self, chunks: Mapping[str, Iterable[int]]) -> bool:
        """Whether every chunk of ``chunks`` (path -> indices) is verified."""
        return all(set(idx) <= self._held.get(p, set()) for p, idx in chunks.items())

    @property
    def complete(self) -> bool:
        """Every chunk of every file is verified (and every file renamed to its name)."""
        return all(len(self._held[f.path]) == len(f.chunks) for f in self.manifest.files)

    def verified_bytes(self) -> int:
        """Bytes of the verified chunks."""
        return sum(e - s for p, idx in self._held.items() for s, e in
                   (chunk_span(self.manifest, p, i) for i in idx))

    # -- reading and writing ----------------------------------------------------------------
    def read_chunk(self, path: str, index: int) -> bytes:
        """The bytes of a verified chunk (to serve it to a peer). Raises ``KeyError`` when
        the chunk is not verified here."""
        if index not in self._held.get(path, set()):
            raise KeyError(f"chunk {index} of {path} is not held here")
        return read_span(self.root, path, *chunk_span(self.manifest, path, index))

    def write_chunk(self, path: str, index: int, data: bytes) -> bool:
        """Verify ``data`` against the manifest (``verify_chunk``) and store it; True when it was new.

        Raises:
            ChunkVerificationError: wrong length or hash (nothing written).
            KeyError / IndexError: a path or chunk the manifest does not list.
            OSError: the chunk could not be written here (a full disk, no permission); it
                is not held then.
        """
        start, _ = verify_chunk(self.manifest, path, index, data)
        entry = self.manifest.file(path)
        with self._lock:
            if index in self._held[path]:
                return False
            fd = open_part(self.root, path)
        try:
            pwrite_all(fd, data, start)
        finally:
            os.close(fd)
        batch: list[tuple[str, int]] = []
        with self._lock:
            if index in self._held[path]:
                return False
            self._held[path].add(index)
            self._pending.append((path, index))
            self._pending_bytes += len(data)
            try:
                if len(self._held[path]) == len(entry.chunks):
                    self._checkpoint()
                    self._finish_file(path)
                elif (self._pending_bytes >= CHECKPOINT_BYTES
                      or time.monotonic() - self._last_checkpoint >= CHECKPOINT_SECONDS):
                    batch, self._pending, self._pending_bytes = self._pending, [], 0
                    self._last_checkpoint = time.monotonic()
                    self._syncing += 1
            except OSError:  # not durable (or its file not renamed): this chunk is not held
                self._held[path].discard(index)
                if (path, index) in self._pending:
                    self._pending.remove((path, index))
                    self._pending_bytes -= len(data)
                raise
        if batch:  # synced outside the lock: the other writers are not held up by the disk
            self._checkpoint_batch(batch, path, index)
        return True

    def discard_file(self, path: str) -> None:
        """Forget every chunk of ``path`` and delete its bytes (a complete file that failed its
        whole-file hash): the journal is rewritten without it, so a fetch asks for it again."""
        with self._lock:
            self._checkpoint()
            self._held[path] = set()
            delete_file(self.root, path)
            journal = self.root / JOURNAL
            kept = without_file(journal.read_text(encoding="utf-8", errors="replace"), path)
            self._journal.close()
            replace_journal(journal, kept)
            self._journal = open(journal, "a", encoding="utf-8")
            self._torn = False
            chunk_journal.unmark_checked(self.root, path)

    def file_checked(self, path: str) -> bool:
        """Whether complete file ``path`` passed its whole-file hash (``mark_checked``)."""
        return chunk_journal.file_checked(self.root, path)

    def mark_checked(self, path: str) -> None:
        """Record that complete file ``path`` passed its whole-file hash."""
        chunk_journal.mark_checked(self.root, path)

    def _finish_file(self, path: str) -> None:
        """Rename a fully verified ``<path>.part`` to ``<path>`` (size fixed to the manifest's)."""
        finish_file(self.root, path, self.manifest.file(path).size)

    def shard_view(self, chunks: Mapping[str, Iterable[int]], name: str) -> Path:
        """A directory a loader can read for a shard needing ``chunks``: one hard link per
        manifest file that the shard touches, named as in the manifest, to the complete file
        or to its ``.part`` (given its full length); ``<views_dir>/<name>``, rebuilt each
        call (``exo_p2p.models.copies.shard_views.build_shard_view``). It stays valid when a
        ``.part`` is renamed or the copy is moved.

        Raises ``ValueError`` when a needed chunk is not verified yet (nothing unverified is
        ever handed to a loader), or when ``name`` (a runner id, which the master chose) is
        not one plain path part. ``OSError`` when the files cannot be linked."""
        return build_shard_view(self.root, self.views_dir, self.manifest, self._held, chunks, name)
