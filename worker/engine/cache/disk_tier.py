"""The prompt cache's disk tier: one rank's finished entries kept as block files, LRU-bounded.

Each runner rank keeps its own directory (``identity.tier_directory``: the node's data dir,
the model's identity, the rank's layer range), so two models or two ranks never share or
evict each other's blocks. A block (``cache.block``) is named by the digest of its tenant
and tokens; the index (tokens and size of every block) is rebuilt from the files' headers
when the tier opens — that is what makes entries survive a restart — least recently used
first by the files' modification times (a load touches its file).

Writes happen on one background thread (``put`` only queues evaluated arrays; at most
``QUEUE_LIMIT`` entries wait, beyond that a write is dropped and counted, never waited
for), so the engine's step never waits on the disk. Before a write, least recently used
blocks are deleted until the new one fits ``max_bytes``; a block larger than the bound is
not written. A write failing with an ``OSError`` (the disk full, read-only, gone) turns the
tier's writing off for the process's life (``writable``, logged once): reads go on, and
the node serves as before. A block that fails any check when scanned or loaded is deleted
and logged with its reason (``BlockError.reason``), and the request prefills instead.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.engine.cache.block import BlockError, check_owner, decode, encode, read_header

log = logging.getLogger(__name__)
SUFFIX = ".kvb"
QUEUE_LIMIT = 4
"""Entries waiting to be written at most (each holds a reference to KV already in RAM)."""
_HEAD_READ = 1 << 16


@dataclass(frozen=True)
class Stored:
    """One block on disk: the ``tokens`` its KV holds, its file's ``size`` in bytes and
    the ``tenant`` it belongs to."""

    tokens: tuple[int, ...]
    size: int
    tenant: str = ""


def block_name(tenant: str, tokens: tuple[int, ...] | list[int]) -> str:
    """The file name of the block holding ``tokens`` for ``tenant`` (32 hex digits)."""
    h = hashlib.blake2b(tenant.encode() + b"\0", digest_size=16)
    h.update(b"".join(int(t).to_bytes(4, "little", signed=False) for t in tokens))
    return h.hexdigest() + SUFFIX


class DiskTier:
    """The tier of one rank in ``directory``, bounded by ``max_bytes`` (> 0), holding KV of
    the model ``identity`` and layers ``layers`` only (module docstring). ``close`` ends the
    writer thread (pending writes are finished first, within ``timeout``)."""

    def __init__(self, directory: Path, max_bytes: int, identity: str, layers: tuple[int, int]) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, not {max_bytes}")
        self.directory, self.max_bytes = Path(directory), max_bytes
        self.identity, self.layers = identity, (int(layers[0]), int(layers[1]))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.writable = True
        self.written = self.write_dropped = self.rejected = 0
        self._index: OrderedDict[str, Stored] = OrderedDict()
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[str, tuple[int, ...], list[Any]] | None] = queue.Queue(QUEUE_LIMIT)
        self._scan()
        self._thread = threading.Thread(target=self._writer, name="prompt-cache-disk", daemon=True)
        self._thread.start()

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks on disk."""
        with self._lock:
            return sum(s.size for s in self._index.values())

    @property
    def blocks(self) -> int:
        with self._lock:
            return len(self._index)

    def _scan(self) -> None:
        """Index every valid block of the directory, oldest first; delete the others."""
        files = sorted(self.directory.glob("*" + SUFFIX), key=lambda p: p.stat().st_mtime)
        for path in files:
            try:
                with open(path, "rb") as f:
                    head = f.read(_HEAD_READ)
                    if len(head) == _HEAD_READ:
                        head += f.read(int.from_bytes(head[10:14], "little"))
                header = read_header(head)
                check_owner(header, self.identity, self.layers, header.tenant)
            except BlockError as e:
                self._reject(path.name, e)
                continue
            except OSError:
                continue
            self._index[path.name] = Stored(tuple(header.tokens), path.stat().st_size, header.tenant)
        for path in self.directory.glob("*.tmp"):
            path.unlink(missing_ok=True)  # a write a crash interrupted

    def _reject(self, name: str, error: BlockError) -> None:
        log.warning("prompt cache disk tier: deleted block %s (%s)", name, error)
        self.rejected += 1
        with self._lock:
            self._index.pop(name, None)
        (self.directory / name).unlink(missing_ok=True)

    def nearest(self, ids: list[int], tenant: str = "") -> tuple[str | None, int]:
        """The block of ``tenant`` sharing the longest prefix with ``ids`` and that length
        (None, 0 when none shares a token). Blocks of other tenants are never candidates."""
        from worker.engine.prompt_cache import common_prefix

        best, length = None, 0
        with self._lock:
            items = list(self._index.items())
        for name, stored in items:
            n = common_prefix(stored.tokens, ids)
            if n > length and stored.tenant == tenant:
                best, length = name, n
        return best, length

    def load(self, name: str, tenant: str = "") -> tuple[tuple[int, ...], list[Any]] | None:
        """The tokens and arrays (per layer: keys, values) of block ``name``, or None when it
        is gone or fails a check (then deleted and logged). The block becomes most recent."""
        path = self.directory / name
        try:
            data = path.read_bytes()
        except OSError:
            with self._lock:
                self._index.pop(name, None)
            return None
        try:
            header, arrays = decode(data, self.identity, self.layers, tenant)
        except BlockError as e:
            self._reject(name, e)
            return None
        with self._lock:
            if name in self._index:
                self._index.move_to_end(name)
        try:
            os.utime(path)
        except OSError:
            pass
        return tuple(header.tokens), arrays

    def put(self, tokens: tuple[int, ...], arrays: list[Any], tenant: str = "") -> bool:
        """Queue the write of ``arrays`` (evaluated; per layer keys, values) holding
        ``tokens``; False when not queued (writing off, already stored, or the queue full)."""
        name = block_name(tenant, tokens)
        with self._lock:
            if name in self._index:
                self._index.move_to_end(name)
                return False
        if not self.writable:
            return False
        try:
            self._queue.put_nowait((tenant, tokens, arrays))
        except queue.Full:
            self.write_dropped += 1
            return False
        return True

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued write is done (at most ``timeout`` seconds); True if so."""
        done = threading.Event()
        waiter = threading.Thread(target=lambda: (self._queue.join(), done.set()), daemon=True)
        waiter.start()
        return done.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Finish pending writes and end the writer thread."""
        self.flush(timeout)
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    def _writer(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(*item)
            except Exception:  # noqa: BLE001 - the writer must outlive any one block
                log.exception("prompt cache disk tier: a write failed")
            finally:
                self._queue.task_done()

    def _write(self, tenant: str, tokens: tuple[int, ...], arrays: list[Any]) -> None:
        if not self.writable:
            return
        data = encode((self.identity, self.layers, tenant, tuple(tokens)), arrays)
        if len(data) > self.max_bytes:
            return
        name = block_name(tenant, tokens)
        self._make_room(len(data))
        tmp = self.directory / (name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, self.directory / name)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            self.writable = False
            log.warning("prompt cache disk tier: stopped writing (%s); serving goes on without new blocks", e)
            return
        with self._lock:
            self._index[name] = Stored(tuple(tokens), len(data), tenant)
        self.written += 1

    def _make_room(self, size: int) -> None:
        """Delete least recently used blocks until ``size`` more bytes fit the bound."""
        while True:
            with self._lock:
                if not self._index or sum(s.size for s in self._index.values()) + size <= self.max_bytes:
                    return
                name, _ = self._index.popitem(last=False)
            (self.directory / name).unlink(missing_ok=True)
