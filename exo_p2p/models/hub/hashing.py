"""SHA-256 of a hub copy's bytes as they arrive (docs/models.md#models-from-a-hub).

A weight chunk read from a hub has no hash in the manifest (``hub.manifest.UNKNOWN``): the
hub publishes one SHA-256 per file. Checking a complete file against it, and then building
the copy's full manifest (the hashes its peers check), would read every byte twice more
after the download. ``ArrivalHashes`` does both while the bytes arrive instead:

- each chunk is hashed once, in the thread that received it: before it is written
  (``note``), or when handed to ``add`` (just written and held in the copy);
- each file's whole SHA-256 is fed in file order: a chunk arriving at the file's frontier is
  fed at once, then every chunk after it that the copy already holds (arrived earlier, from
  a peer, or before a restart) is read back (the page cache, normally) and fed too, so the
  frontier follows the download and the file's hash is ready when its last chunk arrives.
  One thread feeds a file at a time; a receiving thread finding another one feeding it
  returns at once (that one takes its chunk too), so no download waits on a read-back.

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

from exo_p2p.models.copies.partial import PartialModel
from exo_p2p.models.hub.manifest import UNKNOWN
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

    def note(self, path: str, index: int, data: bytes) -> None:
        """Hash chunk ``index`` of ``path`` before it is written into the copy (blocking; any
        thread): once it is held, a thread feeding the file's hash may read it back, and
        finds its hash taken already. The bytes written last are the ones noted last."""
        self._files[path].chunks[index] = hashlib.sha256(data).hexdigest()  # one dict operation: atomic

    def add(self, path: str, index: int, data: bytes) -> None:
        """Chunk ``index`` of ``path``, just written into the copy: hash it (unless ``note``
        did), and feed the file's hash when it is at the frontier (blocking: hashing; any
        thread). Never waits for another thread feeding that file: that thread takes this
        chunk too (it is held already), reading it back."""
        f = self._files[path]
        if index not in f.chunks:
            f.chunks.setdefault(index, hashlib.sha256(data).hexdigest())  # outside the lock: in parallel
        chunks = self.partial.manifest.file(path).chunks
        while f.lock.acquire(blocking=False):
            try:
                if index == f.next:
                    f.whole.update(data)
                    f.next += 1
                index = -1
                self._advance(path, f)  # the frontier may wait on chunks stored otherwise (a header)
            finally:
                f.lock.release()
            # a chunk held after _advance looked and before the release: its writer's add
            # found the lock taken and left it to this thread
            if not (f.next < len(chunks) and self.partial.has({path: (f.next,)})):
                return

    def _advance(self, path: str, f: _File) -> None:
        """Feed the chunks after the frontier that the copy holds (caller holds ``f.lock``);
        a chunk hashed on arrival is not hashed again."""
        chunks = self.partial.manifest.file(path).chunks
        while f.next < len(chunks) and self.partial.has({path: (f.next,)}):
            data = self.partial.read_chunk(path, f.next)
            if f.next not in f.chunks:
                f.chunks[f.next] = hashlib.sha256(data).hexdigest()
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
