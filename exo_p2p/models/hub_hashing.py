"""SHA-256 of a hub copy's bytes as they arrive (docs/models.md#models-from-a-hub).

A weight chunk read from a hub has no hash in the manifest (``hub_manifest.UNKNOWN``): the
hub publishes one SHA-256 per file. Checking a complete file against it, and then building
the copy's full manifest (the hashes its peers check), would read every byte twice more
after the download. ``ArrivalHashes`` does both while the bytes arrive instead:

- each chunk handed to ``add`` (just written and held in the copy) is hashed, in the
  thread that received it;
- each file's whole SHA-256 is fed in file order: a chunk arriving at the file's frontier is
  fed at once, then every chunk after it that the copy already holds (arrived earlier, from
  a peer, or before a restart) is read back (the page cache, normally) and fed too, so the
  frontier follows the download and the file's hash is ready when its last chunk arrives.

``file_sha256`` finishes a file's frontier (reading back what is left) and gives its hex
digest; ``full_manifest`` the copy's manifest with every chunk hashed, once all are. One
``ArrivalHashes`` per copy (``arrivals``), thread-safe; it holds two small digests per chunk
and one hash state per file, never bytes.
"""

from __future__ import annotations

import hashlib
import threading
import weakref

import msgspec

from exo_p2p.models.hub_manifest import UNKNOWN
from exo_p2p.models.partial import PartialModel
from exo_p2p.types.manifest import ModelManifest


class _File:
    """One file's frontier: ``next`` chunk to feed ``whole``; chunk hashes computed so far."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.whole = hashlib.sha256()
        self.next = 0
        self.chunks: dict[int, str] = {}


class ArrivalHashes:
    """The hashes of ``partial``'s chunks and files as they arrive (module docstring)."""

    def __init__(self, partial: PartialModel) -> None:
        self.partial = partial
        self._files = {f.path: _File() for f in partial.manifest.files}

    def add(self, path: str, index: int, data: bytes) -> None:
        """Chunk ``index`` of ``path``, just written into the copy: hash it, and feed the
        file's hash when it is at the frontier (blocking: hashing; any thread)."""
        digest = hashlib.sha256(data).hexdigest()  # outside the lock: threads hash in parallel
        f = self._files[path]
        with f.lock:
            f.chunks.setdefault(index, digest)
            if index == f.next:
                f.whole.update(data)
                f.next += 1
            self._advance(path, f)  # the frontier may wait on chunks stored otherwise (a header)

    def _advance(self, path: str, f: _File) -> None:
        """Feed the chunks after the frontier that the copy holds (caller holds ``f.lock``)."""
        chunks = self.partial.manifest.file(path).chunks
        while f.next < len(chunks) and self.partial.has({path: (f.next,)}):
            data = self.partial.read_chunk(path, f.next)
            f.chunks.setdefault(f.next, hashlib.sha256(data).hexdigest())
            f.whole.update(data)
            f.next += 1

    def file_sha256(self, path: str) -> str:
        """The hex SHA-256 of complete file ``path`` (reading back what the frontier has not
        reached); "" when the copy lacks some of its chunks."""
        f = self._files[path]
        with f.lock:
            self._advance(path, f)
            return f.whole.hexdigest() if f.next == len(self.partial.manifest.file(path).chunks) else ""

    def forget(self, path: str) -> None:
        """Start ``path`` over (its bytes were discarded: ``PartialModel.discard_file``)."""
        self._files[path] = _File()

    def full_manifest(self) -> ModelManifest | None:
        """The copy's manifest with every ``UNKNOWN`` chunk hash filled in, None while some is
        not known yet (``file_sha256`` of every file first)."""
        files = []
        for entry in self.partial.manifest.files:
            known = self._files[entry.path].chunks
            chunks = []
            for i, c in enumerate(entry.chunks):
                if c.sha256 == UNKNOWN and i not in known:
                    return None
                chunks.append(msgspec.structs.replace(c, sha256=c.sha256 if c.sha256 != UNKNOWN else known[i]))
            files.append(msgspec.structs.replace(entry, chunks=tuple(chunks)))
        return msgspec.structs.replace(self.partial.manifest, files=tuple(files))


_ARRIVALS: weakref.WeakKeyDictionary[PartialModel, ArrivalHashes] = weakref.WeakKeyDictionary()
_ARRIVALS_LOCK = threading.Lock()


def arrivals(partial: PartialModel) -> ArrivalHashes:
    """The ``ArrivalHashes`` of ``partial`` (made on first use; dropped with the copy)."""
    with _ARRIVALS_LOCK:
        found = _ARRIVALS.get(partial)
        if found is None:
            found = _ARRIVALS[partial] = ArrivalHashes(partial)
        return found
