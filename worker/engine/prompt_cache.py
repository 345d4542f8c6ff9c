"""The prompt cache: finished sequences' KV, kept so a request extending one prefills less.

When a sequence finishes, its KV (prompt + the tokens fed after it) may be kept as an
entry. A new request starts from the entry sharing the longest prefix with its prompt —
at most all but the prompt's last token, which yields the first token — and prefills only
the rest (a multi-turn conversation: the previous turn's prompt and answer).

Bound: in tokens of KV held (``max_tokens``; the builder derives it from
``--prompt-cache-bytes`` ÷ this rank's KV bytes per token). Least recently used entries go
first (an entry is used when inserted or reused); an entry larger than the whole bound is
not kept.

Ranks (docs/architecture.md#engine): on a multi-rank instance every rank holds its layers'
share of the same entries — the bound is the smallest rank's, agreed at warm-up, and every
rank inserts and evicts at the same steps — and the reused length is agreed at each
accept through ``gather`` (an all-gather ``int64 [1] -> [world, 1]``, a collective: called
on every rank at the same point): the smallest proposal, which is rank 0's unless a rank
holds less than it should.

Disk tier (``disk``, ``worker.engine.cache.disk_tier``; docs/architecture.md "Prompt cache
disk tier"): every kept entry is also queued for the disk in the background; on ``reuse``,
when a block on disk shares a longer prefix than any entry in RAM, it is read back, checked,
kept as an entry (``restored``) and reused — each rank restores its own layers' block, and
the agreed length is still the smallest rank's (a rank whose block failed proposes its RAM
length, so every rank falls back alike).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from exo_p2p.content.prefixes import bounded, entry_digests
from exo_p2p.types.tasks import GenerationParams
from worker.engine.cache.identity import tenant_of
from worker.engine.kvq.layers import from_arrays, layer_arrays, prefix_copy

Gather = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class CachedPrefix:
    """One entry: the ``tokens`` its KV holds, one ``KVCache`` (or ``QuantizedKVCache``) per local layer, its bytes,
    the digests of the prefixes of the request that made it (``exo_p2p.content.prefixes``) and
    its tenant (``cache.identity.tenant_of``: only requests of the same tenant reuse it)."""

    tokens: tuple[int, ...]
    cache: list[Any]
    nbytes: int
    digests: tuple[int, ...] = ()
    tenant: str = ""


def common_prefix(a: tuple[int, ...], b: list[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PromptCache:
    """An LRU of ``CachedPrefix`` bounded by ``max_tokens`` (0: off; see the module docstring).

    ``gather``: the instance's all-gather when it has more than one rank (None: one rank).
    """

    def __init__(self, max_tokens: int = 0, gather: Gather | None = None, disk: Any = None, bits: int = 0) -> None:
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, not {max_tokens}")
        self.max_tokens = max_tokens
        self.bits = bits
        """The KV's bits (0: full precision; entries and disk blocks hold it so, ``kvq``)."""
        self.gather = gather
        self.disk = disk
        """The disk tier (``cache.disk_tier.DiskTier``) or None."""
        self.disk_hits = 0
        """Requests whose reused prefix was read back from the disk tier."""
        self.restored_tokens = 0
        """Prompt tokens reused from blocks read back from disk."""
        self._entries: OrderedDict[int, CachedPrefix] = OrderedDict()
        self._next_key = 0
        self.hits = 0
        """Requests that reused a prefix (counted on ``reuse`` while the cache is on)."""
        self.misses = 0
        """Requests that found none."""
        self.reused_tokens = 0
        """Prompt tokens reused in all."""

    @property
    def enabled(self) -> bool:
        return self.max_tokens > 0

    @property
    def entries(self) -> list[CachedPrefix]:
        """The entries, least recently used first."""
        return list(self._entries.values())

    @property
    def tokens(self) -> int:
        """Tokens of KV held."""
        return sum(len(e.tokens) for e in self._entries.values())

    @property
    def nbytes(self) -> int:
        """Bytes of KV held."""
        return sum(e.nbytes for e in self._entries.values())

    def insert(self, tokens: list[int], cache: list[Any], params: GenerationParams | None = None) -> bool:
        """Keep ``cache`` (one ``KVCache`` per layer holding exactly ``tokens``), evicting least
        recently used entries beyond the bound; ``params``, the request that made it, gives
        the entry its prefix digests. False when not kept: the cache is off, the
        entry alone exceeds the bound, or the cache does not hold ``len(tokens)`` tokens."""
        if not self.enabled or len(tokens) > self.max_tokens:
            return False
        if cache and cache[0].offset != len(tokens):
            return False  # not the tokens we think it holds: never reuse it
        states = [a for c in cache for a in layer_arrays(c)]
        mx.eval(states)
        tenant = tenant_of(params)
        self._keep(tuple(tokens), cache, entry_digests(params), tenant)
        if self.disk is not None:
            self.disk.put(tuple(tokens), states, tenant)
        return True

    def _keep(self, tokens: tuple[int, ...], cache: list[Any], digests: tuple[int, ...], tenant: str) -> int:
        """Add an entry (the most recent), evicting beyond the bound; its key."""
        self._next_key += 1
        self._entries[self._next_key] = CachedPrefix(tokens, cache, sum(c.nbytes for c in cache), digests, tenant)
        while self.tokens > self.max_tokens and len(self._entries) > 1:
            self._entries.popitem(last=False)
        return self._next_key

    def restore(self, ids: list[int], key: int | None, length: int, tenant: str = "") -> tuple[int | None, int, bool]:
        """The RAM entry ``key`` sharing ``length`` tokens with ``ids``, or — when the disk
        tier holds a longer prefix and its block passes every check — that block, read
        back and kept as the most recent entry; (key, length, whether from disk)."""
        if self.disk is None:
            return key, length, False
        name, on_disk = self.disk.nearest(ids, tenant)
        on_disk = min(on_disk, len(ids) - 1)
        if name is None or on_disk <= length:
            return key, length, False
        block = self.disk.load(name, tenant)
        if block is None or len(block[0]) > self.max_tokens:
            return key, length, False
        tokens, arrays = block
        try:
            layers = from_arrays(arrays, len(tokens), self.bits)
        except ValueError:
            return key, length, False  # not this cache's layout (its identity names the bits)
        mx.eval(arrays)
        return self._keep(tokens, layers, (), tenant), on_disk, True

    def digests(self) -> tuple[int, ...]:
        """The prefix digests of the entries, those of the most recently used last, at most
        ``exo_p2p.content.prefixes.MAX_DIGESTS`` (what the runner publishes)."""
        return bounded(d for e in self._entries.values() for d in e.digests)

    def nearest(self, ids: list[int], tenant: str = "") -> tuple[int | None, int]:
        """The key of ``tenant``'s entry sharing the longest prefix with prompt ``ids`` and
        that length, at most ``len(ids) − 1`` (None, 0 when no entry shares a token)."""
        best_key, best = None, 0
        for key, entry in self._entries.items():
            if entry.tenant != tenant:
                continue
            n = common_prefix(entry.tokens, ids)
            if n > best:
                best_key, best = key, n
        return best_key, min(best, len(ids) - 1) if best_key is not None else 0

    def agreed_length(self, length: int) -> int:
        """The reused length every rank uses: the smallest of the ranks' ``length`` (a
        collective with ``gather``), or ``length`` itself on one rank."""
        if self.gather is None:
            return length
        proposals = self.gather(np.array([length], dtype=np.int64)).reshape(-1)
        return int(proposals.min())

    def reuse(self, ids: list[int], tenant: str = "") -> tuple[list[Any], int]:
        """A fresh KV cache holding the longest cached prefix of prompt ``ids`` and its length
        (tokens, agreed across ranks), or ``([], 0)``. The entry used becomes the most
        recently used; the entry itself is never modified. A collective when ``gather`` is
        set (call it on every rank at the same accept, whether or not the cache is enabled
        there: it is not called at all when the cache is off on every rank)."""
        if not self.enabled:
            return [], 0
        key, length, from_disk = self.restore(ids, *self.nearest(ids, tenant), tenant)
        length = self.agreed_length(length)
        if key is None or length < 1:
            self.misses += 1
            return [], 0
        self.hits += 1
        self.reused_tokens += length
        if from_disk:
            self.disk_hits += 1
            self.restored_tokens += length
        self._entries.move_to_end(key)
        return [prefix_copy(c, length) for c in self._entries[key].cache], length
