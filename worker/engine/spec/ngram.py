"""Prompt-lookup drafting: proposals from a row's own prompt and output, no model.

A row's history (prompt, then every token it generated) is indexed by its ``MIN_N``-grams:
each maps to the positions right after its occurrences (the latest ``MAX_CANDIDATES`` kept).
A proposal for the history's tail is the continuation of the earlier occurrence whose
preceding tokens match the tail the longest (counted back up to ``MAX_MATCH`` tokens, as
suffix decoding and vLLM's ``prompt_lookup_max`` do), at most ``k`` tokens, never past the
history's end. Ties go, in order, to the continuation of the span the last proposal copied
from (a copy pointer: a row rewriting its prompt keeps copying the same place), to an
occurrence in the prompt rather than the output, then to the latest. Why longest and not
latest: in a file of near-identical blocks, the latest occurrence of a short tail (say
``"\\n\\ndef step_"``) is the block the row just wrote, whose continuation is the wrong
name; the prompt's occurrence that matches further back is the one being copied
(docs/benchmarks.md "Speculative decoding"). The proposal is a pure function of the
history (and of the previous proposal, itself one), so every rank of an instance proposes
alike. Cost: at most ``MAX_CANDIDATES × MAX_MATCH`` comparisons per proposal.
"""

from __future__ import annotations

from collections.abc import Iterable

MIN_N = 3
"""Shortest tail matched: a one- or two-token tail's continuation is too often wrong in prose
(measured with 2 on free prose: 16% of drafts accepted, docs/benchmarks.md)."""
MAX_MATCH = 32
"""Longest tail compared (tokens): a longer agreement rarely tells candidates apart better."""
MAX_CANDIDATES = 256
"""Occurrences of one ``MIN_N``-gram kept (the latest): bounds a proposal's cost in a
history where a short n-gram repeats thousands of times."""


class NgramIndex:
    """A row's token history and its n-gram index (see the module docstring).

    ``extend(tokens)`` appends tokens; ``propose(k)`` returns at most ``k`` proposed next tokens
    (``[]``: no match or ``k`` ≤ 0). ``prompt_len``: tokens of the history that are the prompt
    (the first ``extend``); memory at most one position per history token.
    """

    def __init__(self, tokens: Iterable[int] = ()) -> None:
        self.history: list[int] = []
        self._index: dict[tuple[int, ...], list[int]] = {}
        self._starts: set[tuple[int, ...]] = set()  # the first MIN_N - 1 tokens of every indexed n-gram
        self._pointer: tuple[int, int] | None = None  # (source position, history length) of the last proposal
        self.extend(tokens)
        self.prompt_len = len(self.history)

    def __len__(self) -> int:
        return len(self.history)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append ``tokens`` (ints), indexing every ``MIN_N``-gram they complete."""
        h = self.history
        for token in tokens:
            h.append(int(token))
            end = len(h) - 1  # the n-gram ending just before the new token is followed by it
            if end >= MIN_N:
                gram = tuple(h[end - MIN_N : end])
                self._starts.add(gram[:-1])
                seen = self._index.setdefault(gram, [])
                if seen and seen[-1] == end:  # indexed already (a token proposed after, then fed)
                    continue
                seen.append(end)
                if len(seen) > MAX_CANDIDATES:
                    del seen[0]

    def may_propose(self) -> bool:
        """Whether some next token could make ``propose`` find a match: the history's last
        ``MIN_N − 1`` tokens began an indexed n-gram (checked before the next token is known)."""
        return len(self.history) >= MIN_N - 1 and tuple(self.history[len(self.history) - MIN_N + 1:]) in self._starts

    def _match(self, start: int) -> int:
        """How many tokens before ``start`` equal the history's tail (at most ``MAX_MATCH``)."""
        h, n = self.history, 0
        last = len(h) - 1
        while n < MAX_MATCH and n < start and h[start - 1 - n] == h[last - n]:
            n += 1
        return n

    def propose(self, k: int) -> list[int]:
        """At most ``k`` tokens continuing the history as its best earlier match did."""
        h = self.history
        if k <= 0 or len(h) <= MIN_N:
            return []
        found = self._index.get(tuple(h[-MIN_N:]))
        if not found:
            return []
        follow = -1
        if self._pointer is not None:  # where the last proposal's source continues now
            follow = self._pointer[0] + len(h) - self._pointer[1]
        best, best_key = -1, (-1, False, False, -1)
        for start in found:
            if start >= len(h):
                continue
            key = (self._match(start), start == follow, start < self.prompt_len, start)
            if key > best_key:
                best, best_key = start, key
        if best < 0:
            return []
        self._pointer = (best, len(h))
        return h[best : min(best + k, len(h))]
