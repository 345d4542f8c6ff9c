"""Room on disk for what a model repository makes a node write (``exo_p2p.models.copies.disk_room``,
docs/security.md): the check before a hub model's small files are kept, the 507 answer
naming free bytes in every API family's shape, the copy removed when a write finds the disk
full, and what a node removes at start when its disk is full."""

from __future__ import annotations

import errno
import hashlib
import json
from pathlib import Path

import msgspec
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from exo_p2p import defaults
from exo_p2p.api.errors import family_error_response
from exo_p2p.models.copies.cleanup import reclaim_fetched
from exo_p2p.models.copies.disk_room import (
    DATA_DIR_RESERVE_BYTES, DiskFullError, check_room, is_disk_full, reclaimable,
)
from exo_p2p.models.hub.fetch import keep_known
from exo_p2p.models.hub.manifest import hub_error_status, hub_error_text
from exo_p2p.types import ErrorInfo
from exo_p2p.types.manifest import Chunk, ManifestFile, ModelManifest

pytestmark = pytest.mark.unit
MIB = 1 << 20


def test_room_is_the_bytes_plus_headroom_plus_the_event_log_reserve():
    need = 100 * MIB
    check_room("x", need, defaults.disk_needed(need) + DATA_DIR_RESERVE_BYTES, "/d")
    with pytest.raises(DiskFullError) as caught:
        check_room("model org/big's config and tokenizer files", need, defaults.disk_needed(need) + DATA_DIR_RESERVE_BYTES - 1, "/d")
    text = str(caught.value)
    assert "org/big" in text and "100.0 MiB to write" in text and "free in /d" in text and "bytes" in text
    assert hub_error_status(caught.value) == 507 and hub_error_text(caught.value) == text
    assert hub_error_status(OSError(errno.ENOSPC, "No space left on device")) == 507
    assert is_disk_full(OSError(errno.EDQUOT, "quota")) and not is_disk_full(OSError(errno.EACCES, "denied"))


@pytest.mark.parametrize("family,shape", [("openai", lambda b: b["error"]["message"]),
                                          ("anthropic", lambda b: b["error"]["message"]),
                                          ("ollama", lambda b: b["error"])])
def test_a_507_keeps_its_status_and_message_in_every_family(family, shape):
    info = ErrorInfo(507, "not enough free disk for x: 1.0 MiB free in /d", "server_error", "model", code="insufficient_storage")
    response = family_error_response(family, info)
    assert response.status_code == 507 and "free in /d" in shape(json.loads(response.body))


@given(st.lists(st.tuples(st.text("abcdef", min_size=1, max_size=4), st.sampled_from(["a", "b", "c"]), st.booleans()),
                max_size=12, unique_by=lambda c: c[0]),
       st.sets(st.sampled_from(["a", "b", "c"])))
def test_only_incomplete_copies_of_unused_models_are_reclaimed(copies, used):
    out = reclaimable(copies, used)
    assert out == sorted(out)
    for digest, name, complete in copies:
        assert (digest in out) == (not complete and name not in used)


def _copy(fetched: Path, name: str, complete: bool, size: int) -> Path:
    """A copy of model ``name`` (its digest, which does not cover the name, set by ``size``)."""
    manifest = ModelManifest(name, MIB, (ManifestFile("config.json", size, (Chunk(0, size, "0" * 64),)),))
    root = fetched / manifest.digest
    root.mkdir(parents=True)
    (root / ".manifest.json").write_bytes(msgspec.json.encode(manifest))
    (root / ("config.json" if complete else "config.json.part")).write_bytes(b"x" * size)
    return root


def test_at_start_a_full_disk_drops_the_incomplete_copies_no_placement_uses(tmp_path: Path):
    fetched = tmp_path / ".fetched"
    unused, used, whole = _copy(fetched, "org/a", False, 1), _copy(fetched, "org/used", False, 2), _copy(fetched, "org/b", True, 3)
    assert reclaim_fetched(fetched, {"org/used"}, DATA_DIR_RESERVE_BYTES) == []  # room enough: nothing
    assert reclaim_fetched(fetched, {"org/used"}, DATA_DIR_RESERVE_BYTES - 1) == [unused]
    assert not unused.exists() and used.exists() and whole.exists()


class _FullPartial:
    """A partial copy whose every write finds the disk full."""

    def __init__(self, manifest: ModelManifest) -> None:
        self.manifest = manifest

    def write_chunk(self, path: str, index: int, data: bytes) -> bool:
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self) -> None:
        pass


class _FullDepot:
    """A depot whose partial copy finds the disk full on its first write: the check before it
    saw room (``free_before``), something else filled the disk meanwhile (3 MiB left)."""

    models_dir = Path("/data/models")

    def __init__(self, free_before: int = DATA_DIR_RESERVE_BYTES + 8 * MIB) -> None:
        self.discarded: list[str] = []
        self._free = [free_before]

    def partial(self, manifest):  # type: ignore[no-untyped-def]
        return _FullPartial(manifest)

    def discard(self, digest: str) -> None:
        self.discarded.append(digest)

    def disk_free(self) -> int:
        return self._free.pop() if self._free else 3 * MIB


def test_a_write_that_finds_the_disk_full_removes_the_copy_and_says_507():
    data = b"{}" * 100
    manifest = ModelManifest("org/m", MIB, (ManifestFile("config.json", len(data), (Chunk(0, len(data), hashlib.sha256(data).hexdigest()),)),))
    depot = _FullDepot()

    async def main() -> None:
        with pytest.raises(DiskFullError) as caught:
            await keep_known(depot, manifest, {"config.json": data})
        assert hub_error_status(caught.value) == 507 and "3.0 MiB" in str(caught.value)

    trio.run(main)
    assert depot.discarded == [manifest.digest]


def test_keeping_a_hub_models_files_without_room_writes_nothing_and_says_507():
    data = b"{}" * 100
    manifest = ModelManifest("org/m", MIB, (ManifestFile("config.json", len(data), (Chunk(0, len(data), hashlib.sha256(data).hexdigest()),)),))
    depot = _FullDepot(free_before=DATA_DIR_RESERVE_BYTES)  # the reserve only: no room for the files

    async def main() -> None:
        with pytest.raises(DiskFullError) as caught:
            await keep_known(depot, manifest, {"config.json": data})
        assert hub_error_status(caught.value) == 507 and "config and tokenizer files" in str(caught.value)

    trio.run(main)
    assert depot.discarded == []  # refused before the copy was opened
