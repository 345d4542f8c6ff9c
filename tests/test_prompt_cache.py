"""The prompt cache (worker/engine/prompt_cache.py) on its own: LRU order, the bound in
tokens, the longest-prefix choice and the reused length agreed through a fake all-gather."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mlx_lm.models.cache import KVCache

from worker.engine.prompt_cache import PromptCache, common_prefix

LAYERS = 2


def kv(tokens: list[int]) -> list[KVCache]:
    """One ``KVCache`` per layer holding ``len(tokens)`` positions; position ``i``'s keys and
    values are the token id, so a reused copy shows which positions it took."""
    caches = []
    for _ in range(LAYERS):
        c = KVCache()
        x = mx.array(tokens, dtype=mx.float32).reshape(1, 1, len(tokens), 1)
        c.update_and_fetch(x, x)
        caches.append(c)
    return caches


def test_lru_order_and_the_bound_in_tokens() -> None:
    cache = PromptCache(max_tokens=10)
    assert cache.insert([1, 2, 3, 4], kv([1, 2, 3, 4]))
    assert cache.insert([5, 6, 7], kv([5, 6, 7]))
    assert [e.tokens for e in cache.entries] == [(1, 2, 3, 4), (5, 6, 7)] and cache.tokens == 7
    reused, n = cache.reuse([1, 2, 3, 9])  # uses the first entry: it becomes the most recent
    assert n == 3 and [e.tokens for e in cache.entries] == [(5, 6, 7), (1, 2, 3, 4)]
    assert cache.insert([8, 8, 8, 8], kv([8, 8, 8, 8]))  # 11 tokens: the least recent goes
    assert [e.tokens for e in cache.entries] == [(1, 2, 3, 4), (8, 8, 8, 8)] and cache.tokens == 8
    assert not cache.insert(list(range(11)), kv(list(range(11))))  # larger than the whole bound
    assert cache.tokens == 8 and cache.nbytes > 0


def test_reuse_copies_the_prefix_and_leaves_the_entry_whole() -> None:
    cache = PromptCache(max_tokens=100)
    cache.insert([4, 5, 6, 7, 8], kv([4, 5, 6, 7, 8]))
    reused, n = cache.reuse([4, 5, 6, 1, 2])
    assert n == 3 and len(reused) == LAYERS
    assert all(c.offset == 3 and c.keys[0, 0, :, 0].tolist() == [4, 5, 6] for c in reused)
    assert cache.entries[0].cache[0].offset == 5  # the entry itself is unchanged
    _, n = cache.reuse([4, 5, 6, 7, 8])  # the same prompt: all but its last token
    assert n == 4
    assert cache.reuse([9, 9]) == ([], 0)


def test_a_cache_not_holding_its_tokens_is_never_kept() -> None:
    cache = PromptCache(max_tokens=100)
    assert not cache.insert([1, 2, 3], kv([1, 2]))
    assert cache.entries == []


def test_off_keeps_nothing_and_never_gathers() -> None:
    calls: list[np.ndarray] = []
    cache = PromptCache(0, gather=lambda row: calls.append(row) or row[None])
    assert not cache.enabled and not cache.insert([1, 2], kv([1, 2]))
    assert cache.reuse([1, 2, 3]) == ([], 0) and calls == []
    with pytest.raises(ValueError):
        PromptCache(-1)


def test_reused_length_is_agreed_across_ranks() -> None:
    """Rank 0 holds the prefix; a rank that (wrongly) holds less lowers the length for all,
    through the all-gather of every rank's proposal."""
    others = [5]  # what the other rank proposes

    def gather(row: np.ndarray) -> np.ndarray:
        return np.array([[int(row[0])], *[[o] for o in others]], dtype=np.int64)

    cache = PromptCache(max_tokens=100, gather=gather)
    cache.insert(list(range(10)), kv(list(range(10))))
    reused, n = cache.reuse(list(range(8)) + [99])
    assert n == 5 and reused[0].offset == 5
    others[0] = 0  # the other rank holds nothing: no reuse on any rank
    assert cache.reuse(list(range(9))) == ([], 0)


@given(a=st.lists(st.integers(0, 3), max_size=12), b=st.lists(st.integers(0, 3), max_size=12))
def test_common_prefix(a: list[int], b: list[int]) -> None:
    n = common_prefix(tuple(a), b)
    assert a[:n] == b[:n] and (n == min(len(a), len(b)) or a[n] != b[n])


@given(entries=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=6), max_size=6),
       prompt=st.lists(st.integers(0, 2), min_size=1, max_size=8), bound=st.integers(1, 20))
def test_nearest_is_the_longest_prefix_below_the_whole_prompt(entries, prompt, bound) -> None:
    cache = PromptCache(max_tokens=bound)
    for tokens in entries:
        cache.insert(tokens, kv(tokens))
    assert cache.tokens <= bound
    key, n = cache.nearest(prompt)
    best = max((common_prefix(e.tokens, prompt) for e in cache.entries), default=0)
    assert n == (min(best, len(prompt) - 1) if best else 0)
    assert (key is None) == (best == 0)
