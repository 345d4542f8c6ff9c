"""The prompt cache's disk tier (``worker.engine.cache``): its block files' checks and its
directory's rules — every block checksummed and owned (model, layers, tenant), a bad one
deleted with its reason and never loaded, the LRU bound, a failing disk turning writing off
while reads go on — and ``PromptCache`` restoring an entry from disk after a "restart" (a
new cache over the same directory)."""

from __future__ import annotations

import logging
from pathlib import Path

import mlx.core as mx
import pytest

from worker.engine.cache.block import VERSION, BlockError, decode, encode
from worker.engine.cache.disk_tier import DiskTier, block_name
from worker.engine.prompt_cache import PromptCache

pytestmark = pytest.mark.unit
ID, LAYERS = "a" * 64, (0, 2)


def kv(tokens: int, layers: int = 2, dtype=mx.bfloat16, seed: int = 0) -> list:
    """``layers`` KV caches holding ``tokens`` tokens (sliced from a larger buffer, as the batch's are)."""
    from mlx_lm.models.cache import KVCache

    mx.random.seed(seed)
    out = []
    for _ in range(layers):
        c = KVCache()
        c.keys = mx.random.normal((1, 2, tokens + 7, 4)).astype(dtype)[..., :tokens, :]
        c.values = mx.random.normal((1, 2, tokens + 7, 4)).astype(dtype)[..., :tokens, :]
        c.offset = tokens
        out.append(c)
    return out


def states(cache: list) -> list:
    arrays = [a for c in cache for a in c.keys_and_values()]
    mx.eval(arrays)
    return arrays


def test_a_block_round_trips_every_dtype_exactly() -> None:
    for dtype in (mx.bfloat16, mx.float16, mx.float32):
        arrays = states(kv(5, dtype=dtype))
        header, back = decode(encode((ID, LAYERS, "", (1, 2, 3, 4, 5)), arrays), ID, LAYERS, "")
        assert header.tokens == (1, 2, 3, 4, 5)
        assert all(b.dtype == a.dtype and b.shape == a.shape and mx.array_equal(a, b).item() for a, b in zip(arrays, back))


@pytest.mark.parametrize("damage, reason", [
    (lambda d: d[:-1], "truncated"),
    (lambda d: d[:40], "truncated"),
    (lambda d: d[:-50] + bytes([d[-50] ^ 1]) + d[-49:], "checksum"),
    (lambda d: b"NOTABLOK" + d[8:], "magic"),
    (lambda d: d[:8] + (VERSION + 1).to_bytes(2, "little") + d[10:], "version"),
])
def test_a_damaged_block_is_refused_with_its_reason(damage, reason: str) -> None:
    data = encode((ID, LAYERS, "", (1, 2, 3)), states(kv(3)))
    with pytest.raises(BlockError) as e:
        decode(damage(data), ID, LAYERS, "")
    assert e.value.reason == reason


@pytest.mark.parametrize("owner, reason", [(("b" * 64, LAYERS, ""), "model"), ((ID, (2, 4), ""), "layers"),
                                           ((ID, LAYERS, "tenant-x"), "tenant")])
def test_a_block_of_another_owner_is_refused(owner, reason: str) -> None:
    data = encode((ID, LAYERS, "", (1, 2, 3)), states(kv(3)))
    with pytest.raises(BlockError) as e:
        decode(data, *owner)
    assert e.value.reason == reason


def tier(path: Path, max_bytes: int = 1 << 20) -> DiskTier:
    return DiskTier(path, max_bytes, ID, LAYERS)


def test_blocks_survive_a_reopen_and_a_prefix_finds_the_longest(tmp_path: Path) -> None:
    t = tier(tmp_path)
    assert t.put((1, 2, 3), states(kv(3))) and t.put((1, 2, 3, 4, 5, 6), states(kv(6)))
    assert t.flush() and t.written == 2
    t.close()
    again = tier(tmp_path)
    name, length = again.nearest([1, 2, 3, 4, 5, 9])
    assert name == block_name("", (1, 2, 3, 4, 5, 6)) and length == 5
    tokens, arrays = again.load(name)  # type: ignore[misc]
    assert tokens == (1, 2, 3, 4, 5, 6) and mx.array_equal(arrays[0], kv(6)[0].keys_and_values()[0]).item()
    assert again.nearest([7, 8]) == (None, 0)
    assert again.nearest([1, 2, 3], tenant="someone") == (None, 0)  # other tenants' blocks are never candidates
    again.close()


def test_the_bound_evicts_the_least_recently_used(tmp_path: Path) -> None:
    one = len(encode((ID, LAYERS, "", (1,) * 8), states(kv(8))))
    t = tier(tmp_path, max_bytes=2 * one + 10)
    for first in (1, 2):
        t.put((first,) * 8, states(kv(8)))
    t.flush()
    t.load(block_name("", (1,) * 8))  # 1 is now more recent than 2
    t.put((3,) * 8, states(kv(8)))
    t.flush()
    assert t.nbytes <= t.max_bytes and t.blocks == 2
    assert not (tmp_path / block_name("", (2,) * 8)).exists() and (tmp_path / block_name("", (1,) * 8)).exists()
    assert not t.put((9,) * 400, states(kv(400))) or (t.flush() and t.blocks == 2)  # larger than the bound: not written
    t.close()


@pytest.mark.parametrize("spoil, reason", [
    (lambda p: p.write_bytes(p.read_bytes()[:-3]), "truncated"),
    (lambda p: p.write_bytes(p.read_bytes()[:-40] + b"\0" * 40), "checksum"),
])
def test_a_spoiled_block_is_deleted_on_load_and_logged(tmp_path: Path, caplog, spoil, reason: str) -> None:
    t = tier(tmp_path)
    t.put((1, 2, 3), states(kv(3)))
    t.flush()
    path = tmp_path / block_name("", (1, 2, 3))
    spoil(path)
    with caplog.at_level(logging.WARNING):
        assert t.load(path.name) is None
    assert not path.exists() and t.blocks == 0 and t.rejected == 1
    assert reason in caplog.text
    t.close()


def test_foreign_blocks_are_deleted_when_the_tier_opens(tmp_path: Path, caplog) -> None:
    other = DiskTier(tmp_path, 1 << 20, "b" * 64, LAYERS)
    other.put((1, 2, 3), states(kv(3)))
    other.flush()
    other.close()
    (tmp_path / "junk.kvb").write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING):
        t = tier(tmp_path)
    assert t.blocks == 0 and t.rejected == 2 and list(tmp_path.iterdir()) == []
    assert "(model: " in caplog.text and "junk.kvb (truncated" in caplog.text
    t.close()


def test_a_failing_disk_stops_writing_and_reads_go_on(tmp_path: Path, caplog, monkeypatch) -> None:
    t = tier(tmp_path)
    t.put((1, 2, 3), states(kv(3)))
    t.flush()

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("worker.engine.cache.disk_tier.open", full, raising=False)
    with caplog.at_level(logging.WARNING):
        t.put((4, 5, 6), states(kv(3)))
        t.flush()
    monkeypatch.undo()
    assert not t.writable and "stopped writing" in caplog.text and t.blocks == 1
    assert not t.put((7, 8), states(kv(2)))  # writing stays off
    assert t.load(block_name("", (1, 2, 3))) is not None
    assert not list(tmp_path.glob("*.tmp"))
    t.close()


def test_the_prompt_cache_restores_a_longer_prefix_from_disk(tmp_path: Path) -> None:
    first = PromptCache(1000, disk=tier(tmp_path))
    cache = kv(6)
    assert first.insert([1, 2, 3, 4, 5, 6], cache)
    first.disk.flush()
    first.disk.close()
    restarted = PromptCache(1000, disk=tier(tmp_path))
    got, length = restarted.reuse([1, 2, 3, 4, 5, 6, 7])
    assert length == 6 and restarted.disk_hits == 1 and restarted.restored_tokens == 6
    assert all(mx.array_equal(g.keys, c.keys_and_values()[0]).item() for g, c in zip(got, cache))
    got, length = restarted.reuse([1, 2, 3, 4, 5, 6, 8])  # now in RAM: no second read
    assert length == 6 and restarted.disk_hits == 1 and restarted.hits == 2
    restarted.disk.close()


def test_with_api_keys_no_tenant_reuses_another_tenants_entry_in_ram_or_on_disk(tmp_path: Path) -> None:
    from exo_p2p.types.tasks import GenerationParams
    from worker.engine.cache.identity import tenant_of

    alice, bob = GenerationParams(messages=(), prompt="x", client="key:alice0000000"), GenerationParams(messages=(), prompt="x", client="key:bob000000000")
    anonymous = GenerationParams(messages=(), prompt="x", client="peer:0123456789ab")
    assert tenant_of(alice) == "key:alice0000000" and tenant_of(anonymous) == "" and tenant_of(None) == ""
    first = PromptCache(1000, disk=tier(tmp_path))
    assert first.insert([1, 2, 3, 4], kv(4), alice)
    first.disk.flush()
    assert first.reuse([1, 2, 3, 4, 5], tenant_of(bob)) == ([], 0)
    assert first.reuse([1, 2, 3, 4, 5], "")[1] == 0  # without a key: not alice's either
    assert first.reuse([1, 2, 3, 4, 5], tenant_of(alice))[1] == 4
    first.disk.close()
    restarted = PromptCache(1000, disk=tier(tmp_path))
    assert restarted.reuse([1, 2, 3, 4, 5], tenant_of(bob)) == ([], 0) and restarted.disk_hits == 0
    assert restarted.reuse([1, 2, 3, 4, 5], tenant_of(alice))[1] == 4 and restarted.disk_hits == 1
    restarted.disk.close()
