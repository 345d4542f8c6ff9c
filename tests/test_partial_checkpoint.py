"""A copy's periodic checkpoint syncs its files outside the copy's lock (exo_p2p/models/copies/partial.py):
other writers go on while the disk flushes, ``flush`` waits for it, a failed one loses nothing
that was durable, and a journal line always names bytes that were synced first."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

import exo_p2p.models.copies.partial as partial_mod
from exo_p2p.models.manifest import build_manifest
from exo_p2p.models.copies.partial import PartialModel
from tests.support.models.synthetic_models import make_synthetic_model

pytestmark = pytest.mark.unit
WAIT = 10.0
"""Seconds a step of these tests may take (each normally takes milliseconds)."""
PATH = "model.safetensors"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("m") / "tiny"
    make_synthetic_model(d, n_layers=2, hidden_size=64, intermediate_size=128, seed=7)
    return d


def _blob(model: Path, m, index: int) -> bytes:
    c = m.file(PATH).chunks[index]
    return (model / PATH).read_bytes()[c.start:c.end]


def _journaled(root: Path) -> list[int]:
    return sorted(int(line.split()[0]) for line in (root / ".verified").read_text().splitlines() if line.strip())


def test_a_writer_is_not_held_up_by_another_writers_checkpoint(tmp_path: Path, model: Path, monkeypatch) -> None:
    m = build_manifest(model, "tiny", chunk_bytes=4096)
    assert len(m.file(PATH).chunks) > 4
    monkeypatch.setattr(partial_mod, "CHECKPOINT_BYTES", 1)  # every write checkpoints
    syncing, release = threading.Event(), threading.Event()
    real = os.fdatasync

    def slow_disk(fd: int) -> None:
        syncing.set()
        assert release.wait(WAIT)
        real(fd)

    root = tmp_path / "c"
    with PartialModel(root, m) as p:
        monkeypatch.setattr(os, "fdatasync", slow_disk)
        first = threading.Thread(target=p.write_chunk, args=(PATH, 0, _blob(model, m, 0)))
        first.start()
        assert syncing.wait(WAIT)  # the first writer's checkpoint is syncing, the disk "slow"
        monkeypatch.setattr(os, "fdatasync", real)
        # a second writer stores its chunk meanwhile: the lock is not held across the sync
        # (its own checkpoint waits for nothing: it syncs and journals on its own)
        assert p.write_chunk(PATH, 1, _blob(model, m, 1))
        assert p.has({PATH: (0, 1)})
        assert _journaled(root) == [1]  # chunk 0's bytes not synced yet: not journaled
        flushed = threading.Thread(target=p.flush)
        flushed.start()
        flushed.join(0.2)
        assert flushed.is_alive()  # flush waits for the checkpoint under way
        release.set()
        first.join(WAIT)
        flushed.join(WAIT)
        assert not first.is_alive() and not flushed.is_alive()
        assert _journaled(root) == [0, 1]
    with PartialModel(root, m) as reopened:
        assert reopened.held() == {PATH: (0, 1)}


def test_a_failed_periodic_checkpoint_keeps_the_other_chunks_pending(tmp_path: Path, model: Path, monkeypatch) -> None:
    m = build_manifest(model, "tiny", chunk_bytes=4096)
    monkeypatch.setattr(partial_mod, "CHECKPOINT_SECONDS", 3600.0)
    root = tmp_path / "c"
    with PartialModel(root, m) as p:
        p.write_chunk(PATH, 0, _blob(model, m, 0))  # pending
        monkeypatch.setattr(partial_mod, "CHECKPOINT_BYTES", 1)

        def no_room(fd: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "fdatasync", no_room)
        with pytest.raises(OSError):
            p.write_chunk(PATH, 2, _blob(model, m, 2))  # its checkpoint (0 and 2) fails
        monkeypatch.undo()
        assert p.held() == {PATH: (0,)}  # the writer's own chunk is not held; chunk 0 still is
        assert _journaled(root) == []
        p.flush()  # chunk 0 was pending again: journaled now
        assert _journaled(root) == [0]
        assert p.write_chunk(PATH, 2, _blob(model, m, 2))
    with PartialModel(root, m) as reopened:
        assert reopened.held() == {PATH: (0, 2)}
        assert reopened.read_chunk(PATH, 2) == _blob(model, m, 2)
