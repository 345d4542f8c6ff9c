"""An embedding request's inputs as token rows, on the API node that has the model's
tokenizer (docs/api.md#embeddings-and-reranking): text through the tokenizer with its special
tokens (BERT's ``[CLS] … [SEP]``, a decoder's BOS; no chat template), token ids as sent, then
the context rule of ``exo_p2p.embeddings.bounds.fit_lengths``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from exo_p2p.embeddings.bounds import EmbedBoundError, fit_lengths

Encode = Callable[[str], Sequence[int]]
"""A tokenizer's ``encode``: text → token ids (special tokens added as the model's tokenizer does)."""


def token_rows(inputs: Sequence[str | Sequence[int]], encode: Encode, *, context: int, vocab: int,
               truncate: bool) -> tuple[tuple[int, ...], ...]:
    """Each input's token ids, cut to ``context`` when ``truncate``. Raises
    ``EmbedBoundError`` (a 400 naming ``input``) for a token id outside ``[0, vocab)``, an
    empty input, an input over the context without ``truncate`` or a request over
    ``MAX_TOTAL_TOKENS``."""
    rows: list[tuple[int, ...]] = []
    for i, item in enumerate(inputs):
        ids = tuple(int(t) for t in (encode(item) if isinstance(item, str) else item))
        if any(not 0 <= t < vocab for t in ids):
            raise EmbedBoundError(f"input {i} has a token id outside the model's vocabulary of {vocab}")
        rows.append(ids)
    lengths = fit_lengths([len(r) for r in rows], context, truncate=truncate)
    return tuple(r[:n] for r, n in zip(rows, lengths))
