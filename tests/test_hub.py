"""Models from a hub, the rules without a network (docs/models.md#models-from-a-hub): the
manifest and card read from a repo's small files and headers equal a local copy's, weight
chunks wait for their hash, a complete file failing the hub's SHA-256 is discarded, the hub
is the last holder a fetch asks, and repo ids and offline mode."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import trio

from exo_p2p.models.card.derive import card_from_model_dir
from exo_p2p.models.transfer.chunk_sets import all_chunks
from exo_p2p.models.transfer.fetch import NOT_HELD, fetch_chunks
from exo_p2p.models.hub.client import hub_offline, is_repo_id, parse_repo
from exo_p2p.models.transfer.fetch_queue import HUB
from exo_p2p.models.hub.manifest import UNKNOWN, check_complete_files, resolve_hub_model, store_known
from exo_p2p.models.manifest import build_manifest, chunk_span
from exo_p2p.models.copies.partial import PartialModel
from tests.support.models.synthetic_models import make_synthetic_model
from tests.support.models.local_repo import LocalRepo

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_synthetic_model(tmp_path_factory.mktemp("hub") / "tiny", n_layers=4, hidden_size=64,
                                intermediate_size=128, seed=5)


def test_the_hub_manifest_is_the_local_layout_with_weight_chunks_unhashed(model_dir):
    repo = LocalRepo(model_dir)
    source, card, manifest, known = resolve_hub_model(repo, "org/tiny")
    local = build_manifest(model_dir, "org/tiny", chunk_bytes=manifest.chunk_bytes)
    assert [(f.path, f.size, f.header_end, f.tensors) for f in manifest.files] == \
        [(f.path, f.size, f.header_end, f.tensors) for f in local.files]
    for hub_file, local_file in zip(manifest.files, local.files):
        for h, c in zip(hub_file.chunks, local_file.chunks, strict=True):
            assert (h.start, h.end) == (c.start, c.end)
            assert h.sha256 in (UNKNOWN, c.sha256)
            assert (h.sha256 == UNKNOWN) == (hub_file.path == "model.safetensors" and c.start >= hub_file.header_end)
    assert card == card_from_model_dir(model_dir, "org/tiny")
    assert source.digest == manifest.digest == resolve_hub_model(LocalRepo(model_dir), "org/tiny")[2].digest
    weights = (model_dir / "model.safetensors").stat().st_size
    assert repo.asked < sum(p.stat().st_size for p in model_dir.iterdir()) - weights + 64 * 1024  # headers only
    assert known["model.safetensors"] == (model_dir / "model.safetensors").read_bytes()[: manifest.file("model.safetensors").header_end]


def test_a_complete_file_failing_the_hub_sha256_is_discarded(model_dir, tmp_path):
    repo = LocalRepo(model_dir)
    _, _, manifest, known = resolve_hub_model(repo, "org/tiny")
    shas = {p: f.sha256 for p, f in repo.files.items() if f.sha256}
    for corrupt in (True, False):
        with PartialModel(tmp_path / f"copy-{corrupt}", manifest) as partial:
            assert store_known(partial, known) > 0
            entry = manifest.file("model.safetensors")
            for i in range(len(entry.chunks)):
                start, end = chunk_span(manifest, entry.path, i)
                data = repo.get_range(entry.path, start, end)
                if corrupt and i == len(entry.chunks) - 1:
                    data = bytes([data[0] ^ 1]) + data[1:]
                assert partial.write_chunk(entry.path, i, data) or i == 0  # chunk 0: the header, stored
            assert check_complete_files(partial, shas) == (["model.safetensors"] if corrupt else [])
            assert partial.has({entry.path: range(len(entry.chunks))}) is (not corrupt)
            assert partial.file_checked(entry.path) is (not corrupt)
        if corrupt:  # the journal forgot it: a reopened copy fetches it again
            with PartialModel(tmp_path / "copy-True", manifest) as again:
                assert entry.path not in again.held()


def _fetch(model_dir, tmp_path, peer_has, with_map: bool = False) -> dict[str, list]:
    """Fetch every chunk with holders ``p1`` (holding the chunks ``peer_has`` accepts) and
    the hub (``with_map``: p1 said up front which it holds); the chunks each was asked for
    and answered, and the hub's runs (chunks per request)."""
    repo = LocalRepo(model_dir)
    _, _, manifest, _ = resolve_hub_model(repo, "org/tiny")
    answered: dict[str, list] = {"p1": [], HUB: []}

    async def get(peer: str, path: str, index: int) -> bytes:
        if peer == "p1" and not peer_has(path, index):
            raise RuntimeError(f"chunk {index} of {path} {NOT_HELD}")
        answered[peer].append((path, index))
        start, end = chunk_span(manifest, path, index)
        return repo.get_range(path, start, end)

    async def get_run(path: str, indices: list[int], deliver) -> None:
        answered["runs"].append(len(indices))
        for i in indices:  # deliver runs in a worker thread, as the hub's streaming does
            data = await get(HUB, path, i)
            await trio.to_thread.run_sync(deliver, i, data)

    answered["runs"] = []
    known = {"p1": {f.path: tuple(i for i in range(len(f.chunks)) if peer_has(f.path, i)) for f in manifest.files}}
    with PartialModel(tmp_path / "copy", manifest) as partial:
        report = trio.run(lambda: fetch_chunks(partial, all_chunks(manifest), ["p1", HUB], get,
                                               known_held=known if with_map else None, get_run=get_run))
        assert partial.complete
    assert sum(report.bytes_by_peer.values()) == manifest.total_bytes
    return answered


def test_the_hub_gives_only_the_chunks_no_peer_holds(model_dir, tmp_path):
    answered = _fetch(model_dir, tmp_path / "all", lambda path, index: True)
    assert answered[HUB] == [] and answered["p1"]
    answered = _fetch(model_dir, tmp_path / "half", lambda path, index: index % 2 == 0)
    assert answered[HUB] and all(i % 2 == 1 for _, i in answered[HUB])
    assert all(i % 2 == 0 for _, i in answered["p1"])
    answered = _fetch(model_dir, tmp_path / "none", lambda path, index: False, with_map=True)
    assert answered["p1"] == [] and max(answered["runs"]) > 1  # consecutive chunks in one request
    assert len(answered["runs"]) < len(answered[HUB])


def test_repo_ids_and_offline(monkeypatch):
    assert parse_repo("mlx-community/Llama-3.2-1B-Instruct-4bit") == ("mlx-community/Llama-3.2-1B-Instruct-4bit", None)
    assert parse_repo("org/name@v1.0") == ("org/name", "v1.0")
    for bad in ("smollm2-135m-instruct", "a/b/c", "org/..", "/x", "org/name@", "org/.hidden/x"):
        assert not is_repo_id(bad), bad
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert not hub_offline() and hub_offline(True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_offline()


def test_a_hub_copy_is_hashed_as_it_arrives_and_needs_no_second_read(model_dir, tmp_path, monkeypatch):
    """Runs streamed from the hub (``hub_run``), out of order: each file's SHA-256 and every
    chunk's hash are known when the fetch ends, equal to what reading the files gives (the
    whole-file check and ``build_manifest``), and a file corrupted on arrival is caught."""
    from exo_p2p.models.transfer import fetch_queue
    from exo_p2p.models.hub.fetch import hub_run
    from exo_p2p.models.hub.hashing import arrivals

    monkeypatch.setattr(fetch_queue, "HUB_RUN_CHUNKS", 3)  # several runs, finishing out of order
    for corrupt in (False, True):
        repo = LocalRepo(model_dir)
        _, _, manifest, known = resolve_hub_model(repo, "org/tiny")
        shas = {p: f.sha256 for p, f in repo.files.items() if f.sha256}
        if corrupt:
            inner = repo.get_range
            repo.get_range = lambda path, start, end: bytes([inner(path, start, start + 1)[0] ^ 1]) + \
                inner(path, start + 1, end) if start > 0 and path.endswith(".safetensors") else inner(path, start, end)

        async def no_peer(peer, path, index):
            raise AssertionError("only the hub is asked")

        with PartialModel(tmp_path / f"copy-{corrupt}", manifest) as partial:
            store_known(partial, known)
            trio.run(lambda: fetch_chunks(partial, all_chunks(manifest), [HUB], no_peer, get_run=hub_run(repo, partial)))
            hashes = arrivals(partial)
            read = []
            monkeypatch.setattr(PartialModel, "read_chunk", lambda self, p, i: read.append(i) or b"")
            assert check_complete_files(partial, shas, hashes.file_sha256) == (["model.safetensors"] if corrupt else [])
            monkeypatch.undo()
            assert read == []  # every file hashed during the fetch: nothing read back at the end
            full = hashes.full_manifest()
        if not corrupt:
            assert full == build_manifest(tmp_path / "copy-False", "org/tiny", chunk_bytes=manifest.chunk_bytes)


def test_every_byte_of_a_hub_copy_is_hashed_twice_at_most(model_dir, tmp_path, monkeypatch):
    """Once for its chunk, once for its file: a chunk fed to its file's hash from a read-back
    (it arrived ahead of the frontier) keeps the hash taken on arrival, and a receiving
    thread never waits for another one feeding the same file."""
    from exo_p2p.models.transfer import fetch_queue
    from exo_p2p.models.hub import hashing as hub_hashing
    from exo_p2p.models.hub.fetch import hub_run

    monkeypatch.setattr(fetch_queue, "HUB_RUN_CHUNKS", 3)  # several runs, finishing out of order
    hashed = [0]
    real = hashlib.sha256

    class Counting:
        def sha256(self, data=b""):
            hashed[0] += len(data)
            h = real()
            h.update(data)
            return h

    monkeypatch.setattr(hub_hashing, "hashlib", Counting())
    repo = LocalRepo(model_dir)
    _, _, manifest, known = resolve_hub_model(repo, "org/tiny")

    async def no_peer(peer, path, index):
        raise AssertionError("only the hub is asked")

    with PartialModel(tmp_path / "copy", manifest) as partial:
        store_known(partial, known)
        trio.run(lambda: fetch_chunks(partial, all_chunks(manifest), [HUB], no_peer, get_run=hub_run(repo, partial)))
        full = hub_hashing.arrivals(partial).full_manifest()
    assert full is not None
    weights = sum(f.size for f in manifest.files if any(c.sha256 == UNKNOWN for c in f.chunks))
    assert hashed[0] <= weights  # the one-shot chunk hashes: each weight byte once (whole-file updates apart)


def test_a_hub_run_the_fetch_gave_up_on_stops_at_its_next_chunk(model_dir, tmp_path):
    """A run's chunks are settled without the receiving thread waiting for trio; once the
    fetch is cancelled, the abandoned thread's next ``deliver`` raises instead of writing."""
    import threading

    repo = LocalRepo(model_dir)
    _, _, manifest, known = resolve_hub_model(repo, "org/tiny")
    proceed, stopped = threading.Event(), threading.Event()
    delivered, raised = [], []

    async def get_run(path: str, indices: list[int], deliver) -> None:
        def stream() -> None:
            try:
                for n, i in enumerate(indices):
                    if n == 1:
                        assert proceed.wait(10)  # the fetch gives up meanwhile
                    start, end = chunk_span(manifest, path, i)
                    deliver(i, repo.get_range(path, start, end))
                    delivered.append(i)
            except BaseException as exc:  # trio.Cancelled, raised in this thread
                raised.append(type(exc).__name__)
            finally:
                stopped.set()

        await trio.to_thread.run_sync(stream, abandon_on_cancel=True)

    async def no_peer(peer, path, index):
        raise AssertionError("only the hub is asked")

    with PartialModel(tmp_path / "copy", manifest) as partial:
        store_known(partial, known)
        before = sum(len(i) for i in partial.held().values())

        async def main() -> None:
            with trio.CancelScope() as scope:
                def progress(done, total, peers, hub):
                    if hub:  # the first chunk settled: give up on the fetch
                        scope.cancel()
                await fetch_chunks(partial, all_chunks(manifest), [HUB], no_peer, get_run=get_run,
                                   on_progress=progress)
            proceed.set()
            assert await trio.to_thread.run_sync(stopped.wait, 10)

        trio.run(main)
        assert len(delivered) == 1 and raised == ["Cancelled"]
        assert sum(len(i) for i in partial.held().values()) == before + 1
