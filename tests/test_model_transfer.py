"""Manifests, verified partial copies and the chunk fetcher (docs/models.md), without processes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
import pytest
import trio

from exo_p2p.models.card.derive import card_from_model_dir
from exo_p2p.models.transfer.chunk_sets import chunk_bytes_of, shard_chunks
from exo_p2p.models.transfer.fetch import FetchLimits, fetch_chunks
from exo_p2p.models.errors import FetchError
from exo_p2p.models.manifest import ChunkVerificationError, build_manifest, cached_manifest, chunk_span
from exo_p2p.models.copies.partial import PartialModel
from tests.support.models.synthetic_models import make_synthetic_model
from exo_p2p.types.manifest import ModelManifest


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("m") / "tiny"
    make_synthetic_model(d, n_layers=4, hidden_size=128, intermediate_size=256, seed=3,
                         tie_word_embeddings=False)
    return d


def _chunk(model: Path, manifest: ModelManifest, path: str, index: int) -> bytes:
    start, end = chunk_span(manifest, path, index)
    with open(model / path, "rb") as f:
        f.seek(start)
        return f.read(end - start)


def test_manifest_lists_files_hashes_and_tensor_ranges(model: Path) -> None:
    m = build_manifest(model, "tiny", chunk_bytes=64 * 1024)
    paths = [f.path for f in m.files]
    assert paths == sorted(paths) and "config.json" in paths and "model.safetensors" in paths
    st = m.file("model.safetensors")
    assert st.size == (model / "model.safetensors").stat().st_size
    assert st.chunks[0].start == 0 and st.chunks[-1].end == st.size
    assert all(a.end == b.start for a, b in zip(st.chunks, st.chunks[1:]))
    assert max(c.end - c.start for c in st.chunks) <= m.chunk_bytes
    assert st.chunks[0].sha256 == hashlib.sha256(_chunk(model, m, "model.safetensors", 0)).hexdigest()
    # tensor ranges tile the data after the header exactly
    assert st.tensors[0].start == st.header_end
    assert all(a.end == b.start for a, b in zip(st.tensors, st.tensors[1:]))
    assert st.tensors[-1].end == st.size
    # identity: same bytes, same digest (the name is not part of it); one changed byte, another
    assert build_manifest(model, "other", chunk_bytes=64 * 1024).digest == m.digest
    decoded = msgspec.json.decode(msgspec.json.encode(m), type=ModelManifest)
    assert decoded.digest == m.digest


def test_manifest_digest_changes_with_content(tmp_path: Path, model: Path) -> None:
    copy = tmp_path / "tiny"
    copy.mkdir()
    for f in model.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    cfg = copy / "generation_config.json"
    cfg.write_text(cfg.read_text() + " ")
    assert build_manifest(copy, "tiny").digest != build_manifest(model, "tiny").digest


def test_cached_manifest_is_rebuilt_when_a_file_changes(tmp_path: Path, model: Path) -> None:
    copy = tmp_path / "tiny"
    copy.mkdir()
    for f in model.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    first = cached_manifest(copy, "tiny", tmp_path / "cache")
    assert cached_manifest(copy, "tiny", tmp_path / "cache") == first
    (copy / "config.json").write_text((copy / "config.json").read_text() + "\n")
    assert cached_manifest(copy, "tiny", tmp_path / "cache").digest != first.digest


def test_shard_chunks_cover_the_share_of_each_rank(model: Path) -> None:
    m = build_manifest(model, "tiny", chunk_bytes=64 * 1024)
    card = card_from_model_dir(model, "tiny")
    everything = shard_chunks(m, start_layer=0, end_layer=4, n_layers=4, tied=False)
    assert chunk_bytes_of(m, everything) == m.total_bytes
    first = shard_chunks(m, start_layer=0, end_layer=2, n_layers=4, tied=False)
    last = shard_chunks(m, start_layer=2, end_layer=4, n_layers=4, tied=False)
    share_last = sum(card.layer_bytes[2:]) + card.last_rank_extra_bytes()
    fetched = chunk_bytes_of(m, last)
    non_weights = sum(f.size for f in m.files if f.path != "model.safetensors")
    header = m.file("model.safetensors").header_end
    # exactly the share's tensors, the header, config and tokenizer files
    assert fetched == share_last + header + non_weights
    assert chunk_bytes_of(m, first) < m.total_bytes
    with pytest.raises(ValueError):
        shard_chunks(m, start_layer=3, end_layer=3, n_layers=4, tied=False)


def test_partial_copy_verifies_resumes_and_renames(tmp_path: Path, model: Path) -> None:
    m = build_manifest(model, "tiny", chunk_bytes=64 * 1024)
    root = tmp_path / "copy"
    st = m.file("model.safetensors")
    with PartialModel(root, m) as p:
        good = _chunk(model, m, st.path, 1)
        with pytest.raises(ChunkVerificationError):
            p.write_chunk(st.path, 1, b"x" + good[1:])
        assert p.held() == {}
        assert p.write_chunk(st.path, 1, good)
        assert not p.write_chunk(st.path, 1, good)  # already held
        with pytest.raises(ValueError, match="not fully verified"):
            p.shard_view({st.path: [0, 1]}, "r0")
    with PartialModel(root, m) as p:  # reopened: the journal remembers the verified chunk
        assert p.held() == {st.path: (1,)}
        assert p.read_chunk(st.path, 1) == good
        for f in m.files:
            for i in range(len(f.chunks)):
                p.write_chunk(f.path, i, _chunk(model, m, f.path, i))
        assert p.complete
        assert not list(root.rglob("*.part"))
        for f in m.files:
            assert (root / f.path).read_bytes() == (model / f.path).read_bytes()
    other = build_manifest(model, "tiny", chunk_bytes=128 * 1024)
    with pytest.raises(ValueError, match="holds manifest"):
        PartialModel(root, other)


def test_torn_journal_line_is_ignored(tmp_path: Path, model: Path) -> None:
    m = build_manifest(model, "tiny", chunk_bytes=64 * 1024)
    root = tmp_path / "copy"
    with PartialModel(root, m) as p:
        p.write_chunk("model.safetensors", 0, _chunk(model, m, "model.safetensors", 0))
    with open(root / ".verified", "a") as f:
        f.write("3 model.safet")  # a crash mid-append
    with PartialModel(root, m) as p:
        assert p.held() == {"model.safetensors": (0,)}


class Peers:
    """Fake holders: ``behaviour[peer]`` is ok / corrupt / stall / die-after-N."""

    def __init__(self, model: Path, manifest: ModelManifest, behaviour: dict[str, str]) -> None:
        self.model, self.manifest, self.behaviour = model, manifest, behaviour
        self.calls: dict[str, int] = {p: 0 for p in behaviour}

    async def get(self, peer: str, path: str, index: int) -> bytes:
        self.calls[peer] += 1
        kind = self.behaviour[peer]
        await trio.sleep(0.001)
        if kind == "stall":
            await trio.sleep_forever()
        if kind.startswith("die-after-") and self.calls[peer] > int(kind.rsplit("-", 1)[1]):
            raise ConnectionError("peer gone")
        data = _chunk(self.model, self.manifest, path, index)
        if kind == "corrupt":
            data = bytes([data[0] ^ 1]) + data[1:]
        return data


def _run(coro_fn, *args, **kwargs):
    return trio.run(lambda: coro_fn(*args, **kwargs))


def test_fetch_from_two_holders_shares_the_chunks(tmp_path: Path, model: Path) -> None:
    m = build_manifest(model, "tiny", chunk_bytes=64 * 1024)
    wanted = shard_chunks(m, start_layer=2, end_layer=4, n_layers=4, tied=False)
    peers = Peers(model, m, {"a": "ok", "b": "ok"})
    progress = []
    with PartialModel(tmp_path / "c", m) as p:
        report = _run(fetch_chunks, p, wanted, ["a", "b"], peers.get,
                      on_progress=lambda d, t, peers_, hub: progress.append((d, t, peers_, hub)))
        assert p.has(wanted)
        view = p.shard_view(wanted, "r1")
    assert report.bytes_fetched == chunk_bytes_of(m, wanted)
    assert set(report.bytes_by_peer) == {"a", "b"}
    assert progress[-1] == (report.bytes_fetched, report.bytes_fetched, report.bytes_fetched, 0)  # all from peers
    assert (view / "config.json").read_bytes() == (model / "config.json").read_bytes()


def test_corrupt_chunk_is_refetched_from_another_holder(tmp_path: Path, model: Path) -> None:
    m = build_manifest(model, "tiny", chunk_bytes=64 * 1024)
    wanted = shard_chunks(m, start_layer=0, end_layer=4, n_layers=4, tied=False)
    peers = Peers(model, m, {"bad": "corrupt", "good": "ok"})
    with PartialModel(tmp_path / "c", m) as p:
        report = _run(fetch_chunks, p, wanted, ["bad", "good"], peers.get)
        assert p.complete
    assert report.bad_chunks_by_peer["bad"] >= 1
    assert "bad" not in report.bytes_by_peer
    for f in m.files:
        assert (tmp_path / "c" / f.path).read_bytes() == (model / f.path).read_bytes()


def test_only_corrupt_holder_fails_with_reason(tmp_path: Path, model: Path) -> None:
    m = build_manifest(model, "tiny", chunk_bytes=64 * 1024)
    wanted = {"config.json": (0,)}
    peers = Peers(model, m, {"bad": "corrupt"})
    with PartialModel(tmp_path / "c", m) as p, pytest.raises(FetchError, match="bad sent 1 bad"):
        _run(fetch_chunks, p, wanted, ["bad"], peers.get)


def test_stalled_peer_is_dropped_within_the_bound(tmp_path: Path, model: Path) -> None:
    m = build_manifest(model, "tiny", chunk_bytes=64 * 1024)
    wanted = shard_chunks(m, start_layer=0, end_layer=4, n_layers=4, tied=False)
    peers = Peers(model, m, {"stuck": "stall", "good": "ok"})
    limits = FetchLimits(streams_per_peer=2, chunk_timeout=0.3, max_peer_failures=2)

    async def main():
        start = trio.current_time()
        with PartialModel(tmp_path / "c", m) as p:
            report = await fetch_chunks(p, wanted, ["stuck", "good"], peers.get, limits=limits)
            assert p.complete
        return report, trio.current_time() - start

    report, elapsed = trio.run(main)
    assert "stuck" in report.dropped and "no answer within 0.3 s" in report.dropped["stuck"]
    assert elapsed < limits.max_peer_failures * limits.chunk_timeout + 5.0


def test_dead_source_resumes_from_disk_and_from_another_holder(tmp_path: Path, model: Path) -> None:
    m = build_manifest(model, "tiny", chunk_bytes=64 * 1024)
    wanted = shard_chunks(m, start_layer=0, end_layer=4, n_layers=4, tied=False)
    n_chunks = sum(len(v) for v in wanted.values())
    limits = FetchLimits(streams_per_peer=1, chunk_timeout=1.0, max_peer_failures=1)
    peers = Peers(model, m, {"a": "die-after-3"})
    with PartialModel(tmp_path / "c", m) as p, pytest.raises(FetchError, match="a: 1 failed"):
        _run(fetch_chunks, p, wanted, ["a"], peers.get, limits=limits)
    # restart: a new process reopens the copy; the verified chunks are not asked for again
    peers = Peers(model, m, {"b": "ok"})
    with PartialModel(tmp_path / "c", m) as p:
        assert sum(len(v) for v in p.held().values()) == 3
        report = _run(fetch_chunks, p, wanted, ["b"], peers.get, limits=limits)
        assert p.complete
    assert report.chunks_fetched == n_chunks - 3 == peers.calls["b"]


def test_a_finished_fetch_journals_every_chunk_it_verified(tmp_path: Path, model: Path) -> None:
    """Without the flush at the end, the chunks of the last checkpoint interval stay
    unjournaled until the copy is closed; a crash then loses them (they are fetched again)."""
    m = build_manifest(model, "tiny", chunk_bytes=64 * 1024)
    # tensor chunks only: no file completes (a completed file would checkpoint everything)
    wanted = {"model.safetensors": shard_chunks(m, start_layer=2, end_layer=4, n_layers=4, tied=False)["model.safetensors"]}
    p = PartialModel(tmp_path / "c", m)
    _run(fetch_chunks, p, wanted, ["a"], Peers(model, m, {"a": "ok"}).get)
    journaled = (tmp_path / "c" / ".verified").read_text().splitlines()  # p is not closed: a crash now
    assert sorted(journaled) == sorted(f"{i} {path}" for path, idx in wanted.items() for i in idx)
    p.close()


def test_partial_holder_lacking_a_chunk_sends_the_fetch_to_another_without_a_strike(tmp_path: Path, model: Path) -> None:
    m = build_manifest(model, "tiny", chunk_bytes=64 * 1024)
    wanted = shard_chunks(m, start_layer=0, end_layer=4, n_layers=4, tied=False)
    with PartialModel(tmp_path / "b", m) as b_copy:  # peer b holds the config files only
        for f in m.files:
            if not f.tensors:
                b_copy.write_chunk(f.path, 0, _chunk(model, m, f.path, 0))
        full = Peers(model, m, {"a": "ok"})
        asked_b = []

        async def get(peer: str, path: str, index: int) -> bytes:
            if peer == "b":
                asked_b.append((path, index))
                try:
                    return b_copy.read_chunk(path, index)
                except KeyError as exc:
                    raise RuntimeError(str(exc)) from None  # as a remote error reply says it
            return await full.get(peer, path, index)

        limits = FetchLimits(streams_per_peer=1, chunk_timeout=5.0, max_peer_failures=1)
        with PartialModel(tmp_path / "c", m) as p:
            report = _run(fetch_chunks, p, wanted, ["b", "a"], get, limits=limits)
            assert p.complete
    assert "b" not in report.dropped  # lacking chunks is no failure (one strike would drop it)
    assert len(asked_b) > 1 and report.bytes_by_peer.get("b", 0) >= 0


def test_chunk_no_holder_has_fails_naming_it(tmp_path: Path, model: Path) -> None:
    m = build_manifest(model, "tiny", chunk_bytes=64 * 1024)

    async def get(peer: str, path: str, index: int) -> bytes:
        raise RuntimeError(f"'chunk {index} of {path} is not held here'")

    with PartialModel(tmp_path / "c", m) as p, pytest.raises(FetchError, match="1 chunks held by none of them"):
        _run(fetch_chunks, p, {"config.json": (0,)}, ["x", "y"], get)


class FakeNet:
    """The two calls the bulk client makes on ``exo_p2p.net.Network``, wired to a server."""

    def __init__(self, server) -> None:
        self.server = server

    def peer_addrs(self, peer: str) -> list[str]:
        return ["/ip4/127.0.0.1/tcp/1/p2p/x"]

    async def request(self, peer: str, protocol: str, data: bytes, *, timeout: float) -> bytes:
        return await self.server.serve_ticket(peer, data)


@pytest.mark.integration
def test_bulk_path_needs_a_fresh_ticket_and_serves_verified_chunks(tmp_path: Path, model: Path) -> None:
    from exo_p2p.models.transfer.bulk import BulkError, BulkServer
    from exo_p2p.models.transfer.bulk_client import BulkConnection, bulk_chunk_getter
    from exo_p2p.models.transfer.protocols import ChunkRequest, LocalModel

    m = build_manifest(model, "tiny", chunk_bytes=64 * 1024)
    source = LocalModel(model, m)
    server = BulkServer(lambda d: source if d == m.digest else None)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run, ["127.0.0.1"])
            get, close = bulk_chunk_getter(FakeNet(server), m.digest, timeout=5.0)
            wanted = shard_chunks(m, start_layer=0, end_layer=4, n_layers=4, tied=False)
            with PartialModel(tmp_path / "c", m) as p:
                await fetch_chunks(p, wanted, ["holder"], get)
                assert p.complete
            await close()
            # a token opens one connection only
            ticket = server.issue("peer", m.digest)
            first = await BulkConnection.open("127.0.0.1", ticket)
            assert await first.get(ChunkRequest(m.digest, "config.json", 0)) == (model / "config.json").read_bytes()
            second = await BulkConnection.open("127.0.0.1", ticket)
            with pytest.raises(BulkError):
                await second.get(ChunkRequest(m.digest, "config.json", 0))
            # a ticket serves its own model only (refused with a reason, connection kept)
            with pytest.raises(BulkError, match="another model"):
                await first.get(ChunkRequest("0" * 64, "config.json", 0))
            await first.aclose()
            await second.aclose()
            with pytest.raises(LookupError):
                server.issue("peer", "0" * 64)
            nursery.cancel_scope.cancel()

    trio.run(main)
    for f in m.files:
        assert (tmp_path / "c" / f.path).read_bytes() == (model / f.path).read_bytes()


def test_only_checkpointed_chunks_survive_a_crash(tmp_path: Path, model: Path, monkeypatch) -> None:
    import exo_p2p.models.copies.partial as partial_mod

    monkeypatch.setattr(partial_mod, "CHECKPOINT_SECONDS", 3600.0)
    m = build_manifest(model, "tiny", chunk_bytes=64 * 1024)
    st = m.file("model.safetensors")
    p = PartialModel(tmp_path / "c", m)
    p.write_chunk(st.path, 0, _chunk(model, m, st.path, 0))
    assert p.held() == {st.path: (0,)}
    # a crash now (no close, no checkpoint): a new process does not trust the unjournaled chunk
    with PartialModel(tmp_path / "c", m) as reopened:
        assert reopened.held() == {}
    p.close()  # close checkpoints: data synced, then journaled
    with PartialModel(tmp_path / "c", m) as reopened:
        assert reopened.held() == {st.path: (0,)}
        assert reopened.read_chunk(st.path, 0) == _chunk(model, m, st.path, 0)
