"""Prompt-lookup drafting: proposals from a row's own prompt and output, no model.

A row's history (prompt, then every token it generated) is indexed by its n-grams
(n = ``MIN_N`` … ``MAX_N``): each n-gram maps to the position right after its latest
occurrence. A proposal for the history's tail is the continuation of the latest earlier
occurrence of its longest indexed tail n-gram (at most ``k`` tokens, never past the history's
end). The index is built once per row (O(prompt)) and grows by O(1) per token, so a proposal
costs a few dictionary look-ups whatever the prompt's length. As in llama.cpp's ``ngram``
speculation and vLLM's prompt lookup (``prompt_lookup_max``/``min``).
"""

from __future__ import annotations

from collections.abc import Iterable

MIN_N = 3
"""Shortest tail matched: a one- or two-token tail's continuation is too often wrong in prose
(measured with 2 on free prose: 16% of drafts accepted, docs/benchmarks.md)."""
MAX_N = 4
"""Longest tail matched: longer tails are rarely more precise and cost look-ups."""


class NgramIndex:
    """A row's token history and its n-gram index (see the module docstring).

    ``extend(tokens)`` appends tokens; ``propose(k)`` returns at most ``k`` proposed next tokens
    (``[]``: no match or ``k`` ≤ 0). Memory: at most ``MAX_N − MIN_N + 1`` entries per
    history token, bounded as the history is (the row's prompt plus its token budget).
    """

    def __init__(self, tokens: Iterable[int] = ()) -> None:
        self.history: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.history)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append ``tokens`` (ints), indexing every n-gram they complete."""
        h = self.history
        for token in tokens:
            h.append(int(token))
            end = len(h) - 1  # the n-grams ending just before the new token are followed by it
            for n in range(MIN_N, MAX_N + 1):
                if end >= n:
                    self._index[tuple(h[end - n : end])] = end

    def propose(self, k: int) -> list[int]:
        """At most ``k`` tokens continuing the history as its latest earlier match did."""
        h = self.history
        if k <= 0:
            return []
        for n in range(MAX_N, MIN_N - 1, -1):
            if len(h) <= n:
                continue
            start = self._index.get(tuple(h[-n:]))
            if start is not None:
                return h[start : min(start + k, len(h))]
        return []
