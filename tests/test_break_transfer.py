"""A hostile or careless peer and user against the model transfer path (docs/models.md), without
processes: manifests whose digest is right but whose paths or ranges are not, and model names
that would name a directory above the pulled models."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import httpx
import msgspec
import pytest
import trio

from exo_p2p.eventlog import EventLog
from exo_p2p.models.transfer.chunk_sets import all_chunks, shard_chunks
from exo_p2p.models.depot.depot import ModelDepot
from exo_p2p.models.transfer.fetch import FetchLimits, fetch_chunks
from exo_p2p.models.errors import FetchError
from exo_p2p.models.manifest import build_manifest, check_manifest
from exo_p2p.models.names import check_model_name
from exo_p2p.models.copies.partial import PartialModel
from exo_p2p.models.transfer.protocols import fetch_manifest
from exo_p2p.models.depot.pulls import PullManager, PullStatus, check_disk
from exo_p2p.models.stores.store import ModelStore
from tests.support.models.synthetic_models import make_synthetic_model
from exo_p2p.node.process import first_leaf
from exo_p2p.types import IndexedEvent, MasterElected, NodeProfile, State
from exo_p2p.types.manifest import Chunk, HeldModel, ManifestFile, ModelManifest, TensorRange


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("m") / "tiny"
    make_synthetic_model(d, n_layers=2, hidden_size=64, intermediate_size=128, seed=5)
    return d


def _one_file(path: str, data: bytes, chunk_bytes: int = 1024) -> ModelManifest:
    return ModelManifest("evil", chunk_bytes, (ManifestFile(path, len(data), (
        Chunk(0, len(data), hashlib.sha256(data).hexdigest()),)),))


def _replace_file(m: ModelManifest, **changes) -> ModelManifest:
    f = msgspec.structs.replace(m.files[0], **changes)
    return msgspec.structs.replace(m, files=(f, *m.files[1:]))


def test_built_manifests_pass_the_check(model: Path) -> None:
    for chunk_bytes in (None, 64 * 1024):
        m = build_manifest(model, "tiny", chunk_bytes=chunk_bytes)
        assert check_manifest(m) is m


@pytest.mark.parametrize("path", ["../escape", "/tmp/escape", "a/../../escape", "", "a//b", ".verified",
                                  ".manifest.json", "a\\..\\b", "x.part", "nul\x00byte", "a/.hidden"])
def test_a_manifest_path_outside_its_copy_is_refused(tmp_path: Path, path: str) -> None:
    """A peer controls a manifest's paths and hashes them into its digest: the copy must
    refuse it before writing anything (it used to write ``root/../escape.part``)."""
    m = _one_file(path, b"owned")
    with pytest.raises(ValueError):
        check_manifest(m)
    root = tmp_path / "deep" / "copy"
    with pytest.raises(ValueError):
        PartialModel(root, m)
    assert not (tmp_path / "deep" / "escape.part").exists() and not (tmp_path / "deep" / "escape").exists()
    assert not (root / ".manifest.json").exists()


def test_file_and_directory_of_one_name_are_refused() -> None:
    m = _one_file("a", b"x")
    m = msgspec.structs.replace(m, files=(*m.files, *_one_file("a/b", b"y").files))
    with pytest.raises(ValueError, match="as a file and a directory"):
        check_manifest(m)
    twice = msgspec.structs.replace(m, files=(m.files[0], m.files[0]))
    with pytest.raises(ValueError, match="twice"):
        check_manifest(twice)


def test_chunks_that_overlap_or_leave_the_file_are_refused(tmp_path: Path) -> None:
    """Overlapping chunks would let a later verified chunk overwrite bytes of an earlier one
    (a journaled chunk no longer matching its hash); a chunk past the file's size is cut by
    the final truncate. Both are refused before a byte is written."""
    a, b = b"A" * 10, b"B" * 10
    h = lambda d: hashlib.sha256(d).hexdigest()  # noqa: E731
    base = _one_file("w.bin", a + b, chunk_bytes=16)
    overlapping = _replace_file(base, chunks=(Chunk(0, 10, h(a)), Chunk(5, 15, h(b)), Chunk(15, 20, h(b[:5]))))
    past_end = _replace_file(base, chunks=(Chunk(0, 10, h(a)), Chunk(10, 26, h(b + a[:6]))))
    gap = _replace_file(base, chunks=(Chunk(0, 10, h(a)), Chunk(12, 20, h(b[:8]))))
    too_long = _replace_file(base, chunks=(Chunk(0, 20, h(a + b)),))
    negative = _replace_file(base, chunks=(Chunk(-4, 10, h(a)), Chunk(10, 20, h(b))))
    bad_hash = _replace_file(base, chunks=(Chunk(0, 10, "zz"), Chunk(10, 20, h(b))))
    short = _replace_file(base, size=30, chunks=(Chunk(0, 10, h(a)), Chunk(10, 20, h(b))))
    for m in (overlapping, past_end, gap, too_long, negative, bad_hash, short):
        with pytest.raises(ValueError):
            check_manifest(m)
        with pytest.raises(ValueError):
            PartialModel(tmp_path / m.digest, m)
    with pytest.raises(ValueError, match="chunk size"):
        check_manifest(msgspec.structs.replace(base, chunk_bytes=0))


def test_tensor_ranges_that_overlap_or_run_past_the_file_are_refused(model: Path) -> None:
    m = build_manifest(model, "tiny")
    i, f = next((i, f) for i, f in enumerate(m.files) if f.tensors)

    def with_tensors(tensors, header_end=f.header_end) -> ModelManifest:
        g = msgspec.structs.replace(f, tensors=tuple(tensors), header_end=header_end)
        return msgspec.structs.replace(m, files=(*m.files[:i], g, *m.files[i + 1:]))

    t0, t1 = f.tensors[0], f.tensors[1]
    for bad in (with_tensors([t0, TensorRange(t1.name, t0.start, t1.end), *f.tensors[2:]]),
                with_tensors([*f.tensors[:-1], TensorRange("x", f.tensors[-1].start, f.size + 1)]),
                with_tensors([TensorRange(t0.name, 0, t0.end), *f.tensors[1:]]),
                with_tensors(f.tensors, header_end=f.size + 1)):
        with pytest.raises(ValueError):
            check_manifest(bad)


class _Net:
    """A peer answering every manifest request with ``reply``."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply

    async def request(self, peer: str, protocol: str, data: bytes, *, timeout: float) -> bytes:
        return self.reply


def test_a_peer_serving_an_unsafe_manifest_with_the_right_digest_is_refused() -> None:
    m = _one_file("../../../escape", b"owned")
    net = _Net(msgspec.json.encode(m))
    with pytest.raises(ValueError, match="malformed manifest"):
        trio.run(lambda: fetch_manifest(net, "rogue", m.digest, timeout=5))
    good = _one_file("config.json", b"{}")
    assert trio.run(lambda: fetch_manifest(_Net(msgspec.json.encode(good)), "p", good.digest, timeout=5)) == good
    for junk in (b"", b"{", b'{"name": 1}', b"\xff\xfe"):
        with pytest.raises((ValueError, msgspec.DecodeError)):
            trio.run(lambda: fetch_manifest(_Net(junk), "p", good.digest, timeout=5))


@pytest.mark.parametrize("name", ["", "..", ".", "../..", "a/../..", "/abs", "a/b/c", "x\x00", "a\\b",
                                  ".fetched", "x" * 300, "a/"])
def test_unsafe_model_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        check_model_name(name)


@pytest.mark.parametrize("name", ["tiny", "mlx-community/Llama-3.2-1B-Instruct-4bit", "модель-ü", "a..b", "x.y"])
def test_ordinary_model_names_pass(name: str) -> None:
    assert check_model_name(name) == name


def test_rm_of_an_unsafe_name_deletes_nothing(tmp_path: Path, model: Path) -> None:
    """``depot.remove("")`` used to delete the whole ``pulled`` dir, ``..`` the models dir
    and ``../..`` the node's data dir (identity included)."""
    data = tmp_path / "data"
    depot = ModelDepot(ModelStore(data, hf_cache=False), data)
    kept = [depot.pulled_dir / "other" / "config.json", data / "identity.key", depot.fetched_dir / "d" / ".verified"]
    for p in kept:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("keep")
    for name in ("", "..", "../..", "other/..", "."):
        with pytest.raises(ValueError):
            depot.remove(name)
    assert all(p.exists() for p in kept)


def test_a_pull_lands_under_the_name_pulled_not_the_manifest_name(tmp_path: Path, model: Path) -> None:
    """The manifest's name is not covered by its digest: a holder could rename it
    ``../../x``; the copy lands under the name the user pulled."""
    data = tmp_path / "data"
    depot = ModelDepot(ModelStore(data, hf_cache=False), data)
    m = msgspec.structs.replace(build_manifest(model, "tiny"), name="../../../escaped")
    p = depot.partial(m)
    for f in m.files:
        blob = (model / f.path).read_bytes()
        for i, c in enumerate(f.chunks):
            p.write_chunk(f.path, i, blob[c.start:c.end])
    assert p.complete
    with pytest.raises(ValueError):
        depot.promote(m.digest, "../x")
    target = depot.promote(m.digest, "tiny")
    assert target == depot.pulled_dir / "tiny" and (target / "config.json").is_file()
    assert not (tmp_path / "escaped").exists() and not (data / "escaped").exists()


class _FullDisk:
    """``os.pwrite`` as a file system that fills up after ``room`` bytes: the call that
    crosses it writes what fits and returns the short count, later calls raise ENOSPC."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.real = os.pwrite

    def __call__(self, fd: int, data, offset: int) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = min(len(data), self.room)
        self.room -= n
        return self.real(fd, bytes(data[:n]), offset)


def _blob(model: Path, m: ModelManifest, path: str, index: int) -> bytes:
    c = m.file(path).chunks[index]
    return (model / path).read_bytes()[c.start:c.end]


def test_a_chunk_cut_short_by_a_full_disk_is_not_held(tmp_path: Path, model: Path, monkeypatch) -> None:
    """A short ``pwrite`` used to journal the chunk as verified with its tail never written
    (a loader then read zeros; a peer got a short chunk)."""
    m = build_manifest(model, "tiny", chunk_bytes=64 * 1024)
    path = "model.safetensors"
    root = tmp_path / "c"
    with PartialModel(root, m) as p:
        first = _blob(model, m, path, 1)
        monkeypatch.setattr(os, "pwrite", _FullDisk(len(first) // 2))
        with pytest.raises(OSError):
            p.write_chunk(path, 1, first)
        assert p.held() == {}
        with pytest.raises(KeyError):
            p.read_chunk(path, 1)
        monkeypatch.undo()
    with PartialModel(root, m) as p:
        assert p.held() == {}
        assert p.write_chunk(path, 1, first) and p.read_chunk(path, 1) == first


def test_a_full_disk_stops_the_fetch_naming_this_node_not_the_peer(tmp_path: Path, model: Path, monkeypatch) -> None:
    """A write error is this node's: it used to be counted as a failure of the holder
    (dropped after 2, the error blaming it), each worker asking for more chunks meanwhile."""
    m = build_manifest(model, "tiny", chunk_bytes=64 * 1024)
    asked: list[str] = []

    async def get(peer: str, path: str, index: int) -> bytes:
        asked.append(peer)
        await trio.sleep(0)
        return _blob(model, m, path, index)

    with PartialModel(tmp_path / "c", m) as p:
        monkeypatch.setattr(os, "pwrite", _FullDisk(20_000))
        with pytest.raises(FetchError, match="cannot write chunks of tiny to .*No space left") as err:
            trio.run(lambda: fetch_chunks(p, all_chunks(m), ["a", "b"], get,
                                          limits=FetchLimits(streams_per_peer=2, max_peer_failures=2)))
        monkeypatch.undo()
        assert "failed requests" not in str(err.value)
        in_flight = 2 * 2  # stopped at the first failed write: only the requests then in flight
        assert len(asked) <= sum(len(i) for i in p.held().values()) + in_flight, asked
        for path, indices in p.held().items():  # what it holds is whole
            for i in indices:
                assert p.read_chunk(path, i) == _blob(model, m, path, i)


def test_a_file_whose_last_chunk_cannot_be_journaled_is_not_complete(tmp_path: Path, model: Path, monkeypatch) -> None:
    m = build_manifest(model, "tiny", chunk_bytes=64 * 1024)
    with PartialModel(tmp_path / "c", m) as p:
        def no_room(fd: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "fdatasync", no_room)
        with pytest.raises(OSError):
            p.write_chunk("config.json", 0, _blob(model, m, "config.json", 0))
        assert not p.has({"config.json": (0,)}) and not (tmp_path / "c" / "config.json").exists()
        monkeypatch.undo()
        assert p.write_chunk("config.json", 0, _blob(model, m, "config.json", 0))
        assert (tmp_path / "c" / "config.json").read_bytes() == (model / "config.json").read_bytes()


def test_check_disk_needs_the_bytes_plus_headroom() -> None:
    check_disk(1000, 1100)
    with pytest.raises(FetchError, match="needs 1000 bytes"):
        check_disk(1000, 1099)
    check_disk(0, 0)


def test_a_pull_larger_than_the_free_disk_fails_before_writing(tmp_path: Path, model: Path, monkeypatch) -> None:
    """A pull used to write until the disk was full; the node's next event log append then
    stopped the node."""
    m = build_manifest(model, "tiny")
    data = tmp_path / "data"
    depot = ModelDepot(ModelStore(data, hf_cache=False), data)
    monkeypatch.setattr(depot, "disk_free", lambda: m.total_bytes)  # < total + 10%
    peer = NodeProfile("peer", "boot", "p", 1, 1, held_models=(HeldModel("tiny", m.digest, True),))
    state = State(nodes={"peer": peer})

    async def main() -> PullStatus:
        async with trio.open_nursery() as nursery:
            async def on_done() -> None:
                pass
            pulls = PullManager(depot, _Net(msgspec.json.encode(m)), "me", lambda: state, nursery, on_done)
            status = pulls.start("tiny")
            with trio.fail_after(10):
                while status.state == "running":
                    await trio.sleep(0.01)
            return status

    status = trio.run(main)
    assert status.state == "failed" and "not enough free disk" in (status.error or ""), status
    fetched = depot.fetched_dir / m.digest
    assert not any(p.name.endswith(".part") or p.name in {f.path for f in m.files} for p in fetched.rglob("*"))


def test_an_event_log_on_a_full_disk_names_its_path_and_closes_quietly(tmp_path: Path, monkeypatch) -> None:
    log = EventLog(tmp_path / "events.log")
    event = IndexedEvent(term=1, idx=1, event=MasterElected("node-a", 1))  # any event
    log.append(event)

    class Full:
        def __init__(self, inner) -> None:
            self.inner = inner

        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name: str):
            return getattr(self.inner, name)

    log._file = Full(log._file)
    with pytest.raises(OSError, match="event log.*No space left.*events.log"):
        log.append(IndexedEvent(term=1, idx=2, event=event.event))
    assert len(log) == 1
    log._file = log._file.inner
    log._file.write(b"x" * 10)  # a buffered tail the disk refuses at close

    def refuse(fd: int, data) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", refuse)
    log.close()  # logged, not raised
    monkeypatch.undo()
    assert len(EventLog(tmp_path / "events.log")) == 1


def test_first_leaf_looks_into_nested_groups() -> None:
    inner = OSError(errno.ENOSPC, "full")
    group = BaseExceptionGroup("outer", [BaseExceptionGroup("inner", [inner])])  # noqa: F821
    assert first_leaf(group) is inner and first_leaf(inner) is inner


class _Backend:
    """What ``model_routes`` needs: a real depot and pull table, an empty State."""

    def __init__(self, depot: ModelDepot) -> None:
        self.depot = depot
        self.pulls = type("Pulls", (), {"pulls": {}})()
        self.node_id = "me"

    def state(self) -> State:
        return State()

    async def models_changed(self) -> None:
        pass


def _delete(backend: _Backend, name: str) -> httpx.Response:
    from starlette.applications import Starlette

    from exo_p2p.api.app import _api_error
    from exo_p2p.api.errors import ApiError
    from exo_p2p.api.model_routes import model_routes

    app = Starlette(routes=model_routes(backend, 1 << 20), exception_handlers={ApiError: _api_error})

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
            return await c.delete(f"/models/{name}")

    return trio.run(go)


def test_rm_while_the_model_is_being_pulled_is_refused(tmp_path: Path, model: Path) -> None:
    """``rm`` during a pull used to delete the copy under the running fetch: the pull then
    failed blaming the holder ("I/O operation on closed file") and left an orphan
    ``.fetched/DIGEST`` dir (no manifest in it) that no later ``rm`` finds."""
    data = tmp_path / "data"
    depot = ModelDepot(ModelStore(data, hf_cache=False), data)
    m = build_manifest(model, "tiny")
    p = depot.partial(m)
    f = m.files[0]
    p.write_chunk(f.path, 0, (model / f.path).read_bytes()[f.chunks[0].start:f.chunks[0].end])
    backend = _Backend(depot)
    backend.pulls.pulls["tiny"] = PullStatus(model="tiny", digest=m.digest, holders=("peer",))
    reply = _delete(backend, "tiny")
    assert reply.status_code == 409 and "being pulled" in reply.text, reply.text
    assert (p.root / ".manifest.json").exists() and p.has({f.path: (0,)})
    backend.pulls.pulls["tiny"].state = "failed"
    assert _delete(backend, "tiny").status_code == 200
    assert not p.root.exists()


@pytest.mark.integration
def test_a_bulk_reply_longer_than_any_chunk_fails_before_it_is_buffered() -> None:
    """A holder announcing a 1 TiB reply used to have the fetcher buffer whatever it sent
    (until memory or the 30 s chunk bound ran out)."""
    from exo_p2p.models.transfer.bulk import TOKEN_BYTES, _REPLY, BulkError, BulkTicket
    from exo_p2p.models.transfer.bulk_client import BulkConnection
    from exo_p2p.models.transfer.protocols import ChunkRequest

    sent = [0]

    async def rogue(stream: trio.SocketStream) -> None:
        got = b""
        while len(got) < TOKEN_BYTES + 4:
            got += await stream.receive_some(1024)
        await stream.send_all(_REPLY.pack(0, 1 << 40))
        block = bytes(1 << 20)
        try:
            for _ in range(16):
                await stream.send_all(block)
                sent[0] += len(block)
            await trio.sleep_forever()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(trio.serve_tcp, rogue, 0)
            port = listeners[0].socket.getsockname()[1]
            conn = await BulkConnection.open("127.0.0.1", BulkTicket(port, bytes(TOKEN_BYTES)))
            with trio.fail_after(5), pytest.raises(BulkError, match="more than a chunk"):
                await conn.get(ChunkRequest("d" * 64, "model.safetensors", 0))
            await conn.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)


@pytest.mark.parametrize("runner_id", ["../../victim", "..", "a/../../victim", "/abs"])
def test_a_shard_view_named_outside_the_copy_deletes_nothing(tmp_path: Path, model: Path, runner_id: str) -> None:
    """The view's name is a runner id from the master; the view dir is deleted and rebuilt,
    so a hostile master naming a runner ``../../victim`` used to delete that directory."""
    m = build_manifest(model, "tiny")
    root = tmp_path / "copy"
    victim = tmp_path / "victim" / "keep.txt"
    victim.parent.mkdir()
    victim.write_text("keep")
    (root / ".views").mkdir(parents=True)
    with PartialModel(root, m) as p:
        for f in m.files:
            blob = (model / f.path).read_bytes()
            for i, c in enumerate(f.chunks):
                p.write_chunk(f.path, i, blob[c.start:c.end])
        with pytest.raises(ValueError):
            p.shard_view(all_chunks(m), runner_id)
        assert victim.exists()
        assert (p.shard_view(all_chunks(m), "inst-r0") / "config.json").is_file()


def test_a_pulled_repo_id_model_is_listed_under_its_name(tmp_path: Path, model: Path) -> None:
    """A pull of ``org/name`` (a model from a holder's Hugging Face cache) lands in
    ``pulled/org/name``; the store used to scan only one level, so the pulled copy was never
    listed (and a second pull failed: the dir already exists)."""
    data = tmp_path / "data"
    pulled = data / "models" / "pulled"
    store = ModelStore(data, [pulled], hf_cache=False, find_embedded=_no_embedded)
    depot = ModelDepot(store, data)
    m = build_manifest(model, "tiny")
    p = depot.partial(m)
    for f in m.files:
        blob = (model / f.path).read_bytes()
        for i, c in enumerate(f.chunks):
            p.write_chunk(f.path, i, blob[c.start:c.end])
    depot.promote(m.digest, "mlx-community/Tiny-4bit")
    assert "mlx-community/Tiny-4bit" in store.sources()
    depot.refresh()
    assert depot.local_digest("mlx-community/Tiny-4bit") == m.digest
    assert depot.remove("mlx-community/Tiny-4bit") and "mlx-community/Tiny-4bit" not in store.sources()
    assert list(pulled.iterdir()) == []


def _no_embedded() -> Path:
    from exo_p2p.models.errors import ModelNotFoundError

    raise ModelNotFoundError("no embedded model in this test")


def test_a_torn_journal_line_never_joins_the_next_one(tmp_path: Path, model: Path) -> None:
    """A crash (or a full disk) can cut the journal after ``1``; the next checkpoint's line
    ``5 model.safetensors`` used to join it as ``15 model.safetensors``: chunk 15, never
    written, counted as verified after the next restart."""
    m = build_manifest(model, "tiny", chunk_bytes=64 * 1024)
    path = "model.safetensors"
    assert len(m.file(path).chunks) > 15
    root = tmp_path / "c"
    with PartialModel(root, m):
        pass
    with open(root / ".verified", "a") as f:
        f.write("1")  # torn
    with PartialModel(root, m) as p:
        p.write_chunk(path, 5, _blob(model, m, path, 5))
    with PartialModel(root, m) as p:
        assert p.held() == {path: (5,)}


def test_a_journal_append_cut_by_a_full_disk_never_joins_the_next_one(tmp_path: Path, model: Path, monkeypatch) -> None:
    m = build_manifest(model, "tiny", chunk_bytes=64 * 1024)
    path = "model.safetensors"
    root = tmp_path / "c"
    p = PartialModel(root, m)
    real_fsync = os.fsync

    def full(fd: int) -> None:
        with open(root / ".verified", "a") as f:  # what reached the disk: a cut line
            f.write("1")
        raise OSError(errno.ENOSPC, "No space left on device")

    p.write_chunk(path, 3, _blob(model, m, path, 3))  # pending, not journaled yet
    p._journal = open(os.devnull, "w")  # the real appends below are simulated by `full`
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        p.flush()
    monkeypatch.setattr(os, "fsync", real_fsync)
    p._journal.close()
    p._journal = open(root / ".verified", "a", encoding="utf-8")
    p.flush()
    p.close()
    with PartialModel(root, m) as q:
        assert q.held() == {path: (3,)}


def _write(p: PartialModel, model: Path, chunks) -> None:
    for path, indices in chunks.items():
        blob = (model / path).read_bytes()
        for i in indices:
            c = p.manifest.file(path).chunks[i]
            p.write_chunk(path, i, blob[c.start:c.end])


def _view_matches(view: Path, model: Path, m: ModelManifest, chunks) -> bool:
    for path, indices in chunks.items():
        with open(view / path, "rb") as f:  # raises when the view's entry dangles
            for i in indices:
                c = m.file(path).chunks[i]
                f.seek(c.start)
                if f.read(c.end - c.start) != (model / path).read_bytes()[c.start:c.end]:
                    return False
    return True


def test_a_shard_view_stays_valid_when_its_files_complete_and_a_pull_promotes_the_copy(
        tmp_path: Path, model: Path) -> None:
    """A rank's view used to symlink ``.fetched/D/f.part``: the last chunk of ``f`` (fetched
    by another rank or a pull) renamed it to ``f``, and a pull moved the whole copy to
    ``pulled/``: the view's links dangled, so a reload of the running rank from its view
    failed. Views now hard-link the files from outside the copy."""
    data = tmp_path / "data"
    depot = ModelDepot(ModelStore(data, hf_cache=False), data)
    m = build_manifest(model, "tiny", chunk_bytes=4096)
    rank0 = shard_chunks(m, start_layer=0, end_layer=1, n_layers=2, tied=False)
    p = depot.partial(m)
    _write(p, model, rank0)
    view = p.shard_view(rank0, "inst-r0")
    assert any((p.root / f"{path}.part").exists() for path in rank0)  # the view uses a .part
    assert _view_matches(view, model, m, rank0)
    _write(p, model, all_chunks(m))  # another fetch completes the copy: every .part renamed
    assert p.complete and not list(p.root.rglob("*.part"))
    assert _view_matches(view, model, m, rank0)
    target = depot.promote(m.digest, "tiny")  # the pull's last step
    assert not (data / "models" / ".fetched" / m.digest).exists() and (target / "config.json").is_file()
    assert _view_matches(view, model, m, rank0)
    assert (view / "config.json").read_bytes() == (model / "config.json").read_bytes()
    assert depot.remove("tiny") == [target]
    assert not view.exists()  # rm frees the bytes the view's links still held


class _StalledNet:
    """A peer that never answers (a pull stays running)."""

    async def request(self, peer: str, protocol: str, data: bytes, *, timeout: float) -> bytes:
        await trio.sleep_forever()
        raise AssertionError


def test_a_second_pull_of_the_same_files_under_another_name_is_refused_with_409(tmp_path: Path, model: Path) -> None:
    """Pulls of one manifest under two names used to share the partial copy ``.fetched/D``:
    the first to finish moved it to its ``pulled/NAME`` and closed its journal under the
    other, which then failed ("not completely fetched") or wrote into a dir recreated empty.
    The second is now refused with 409 naming the running pull, and may start once it ended."""
    from starlette.applications import Starlette

    from exo_p2p.api.app import _api_error
    from exo_p2p.api.errors import ApiError
    from exo_p2p.api.model_routes import model_routes
    from exo_p2p.models.depot.pulls import PullError  # a PullConflict: the API's 409

    m = build_manifest(model, "tiny")
    data = tmp_path / "data"
    depot = ModelDepot(ModelStore(data, hf_cache=False), data)
    peer = NodeProfile("peer", "boot", "p", 1, 1, held_models=(HeldModel("tiny", m.digest, True),
                                                                HeldModel("tiny-copy", m.digest, True)))
    state = State(nodes={"peer": peer})

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            async def on_done() -> None:
                pass
            pulls = PullManager(depot, _StalledNet(), "me", lambda: state, nursery, on_done)
            backend = _Backend(depot)
            backend.pulls = pulls
            app = Starlette(routes=model_routes(backend, 1 << 20), exception_handlers={ApiError: _api_error})
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
                assert (await c.post("/models/pull", json={"model": "tiny"})).status_code == 201
                reply = await c.post("/models/pull", json={"model": "tiny-copy"})
                assert reply.status_code == 409, reply.text
                message = reply.json()["error"]["message"]
                assert "being pulled as 'tiny'" in message and m.digest[:12] in message, message
                with pytest.raises(PullError, match="already being pulled"):
                    pulls.start("tiny-copy")
                assert set(pulls.pulls) == {"tiny"}
                pulls.pulls["tiny"].state = "failed"  # that pull ended: the other name may start
                assert (await c.post("/models/pull", json={"model": "tiny-copy"})).status_code == 201
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_fetched_dirs_no_copy_owns_are_cleaned_and_nothing_else(tmp_path: Path, model: Path) -> None:
    """An ``rm`` under a running fetch (older versions) left ``.fetched/D/`` re-created with a
    chunk and no manifest: no ``rm`` found it and its bytes stayed forever. ``clean_orphans``
    (run at node start) deletes it and the views of deleted copies, and keeps every dir with
    a manifest, the copies the depot has open and the views of any live copy."""
    data = tmp_path / "data"
    depot = ModelDepot(ModelStore(data, hf_cache=False), data)
    m = build_manifest(model, "tiny", chunk_bytes=4096)
    orphan = depot.fetched_dir / ("e" * 64)
    (orphan / "sub").mkdir(parents=True)
    (orphan / "sub" / "model.safetensors.part").write_bytes(b"x" * 100)
    p = depot.partial(m)  # an open copy (a running fetch), its first chunk written
    f = m.files[0]
    p.write_chunk(f.path, 0, (model / f.path).read_bytes()[f.chunks[0].start:f.chunks[0].end])
    shut = depot.fetched_dir / ("c" * 64)  # a copy of an earlier run, not opened yet
    shut.mkdir()
    (shut / ".manifest.json").write_bytes(b"{}")
    views = depot.fetched_dir / ".views"
    for digest in (m.digest, "c" * 64, "d" * 64, "f" * 64):
        (views / digest / "inst-r0").mkdir(parents=True)
    (depot.pulled_dir / "org" / "pulled").mkdir(parents=True)  # a pulled copy and its views ("d")
    (depot.pulled_dir / "org" / "pulled" / ".manifest.json").write_bytes(msgspec.json.encode(
        msgspec.structs.replace(m, files=m.files[:1])))
    d = msgspec.structs.replace(m, files=m.files[:1]).digest
    (views / d / "inst-r1").mkdir(parents=True)
    removed = depot.clean_orphans()
    assert sorted(removed) == sorted([orphan, views / ("d" * 64), views / ("f" * 64)])
    assert not orphan.exists() and p.root.is_dir() and p.has({f.path: (0,)}) and shut.is_dir()
    assert {v.name for v in views.iterdir()} == {m.digest, "c" * 64, d}
    assert depot.clean_orphans() == []


def test_a_rank_fetch_during_which_a_pull_promotes_the_copy_still_gets_its_view(
        tmp_path: Path, model: Path, monkeypatch) -> None:
    """A pull finishing while a rank fetched the same copy moved it to ``pulled/``; the rank
    then asked the depot for its copy again, got a new empty one at ``.fetched/D`` and failed
    ("shard not fully verified yet"). It now builds its view from the copy it fetched into,
    wherever the pull moved it."""
    from exo_p2p.models.transfer.fetch import FetchReport
    from exo_p2p.models.depot.shard_fetch import fetch_shard
    from exo_p2p.types import Instance, ShardMetadata

    data = tmp_path / "data"
    depot = ModelDepot(ModelStore(data, hf_cache=False), data)
    m = build_manifest(model, "tiny", chunk_bytes=4096)
    shards = tuple(ShardMetadata(f"n{r}", f"i-r{r}", r, 2, r, r + 1, 2, 100, "boot") for r in range(2))
    instance = Instance("i", "tiny", "pipeline", shards, model_digest=m.digest)
    peer = NodeProfile("peer", "boot", "p", 1, 1, held_models=(HeldModel("tiny", m.digest, True),))
    state = State(nodes={"peer": peer})

    async def fetch_then_a_pull_promotes(net, manifest, wanted, holders, **kw) -> FetchReport:
        _write(depot.partial(manifest), model, all_chunks(manifest))  # the pull's fetch did it all
        await trio.to_thread.run_sync(depot.promote, manifest.digest, "tiny")
        return FetchReport()

    monkeypatch.setattr(depot, "fetch", fetch_then_a_pull_promotes)
    monkeypatch.setattr(depot, "manifest", lambda digest: m)
    view = trio.run(lambda: fetch_shard(depot, None, "me", lambda: state, instance, shards[0], rounds=1))
    rank0 = shard_chunks(m, start_layer=0, end_layer=1, n_layers=2, tied=False)
    assert _view_matches(view, model, m, rank0) and (depot.pulled_dir / "tiny" / "config.json").is_file()
