"""What one embedding or rerank request may make a node spend (docs/security.md#bounds).

The sizes a body may have (inputs, documents, token ids, dimensions) are checked by the API
node before anything is sent (``exo_p2p.embeddings.requests``); the tokens an input counts
are known where the tokenizer is, the runner, which checks them with ``fit_lengths`` and
answers a 400 for an input over the model's context (cut when the request asks ``truncate``)
or a request over ``MAX_TOTAL_TOKENS``.
"""

from __future__ import annotations

MAX_INPUTS = 2048
"""Inputs per embedding request (OpenAI's own limit)."""

MAX_RERANK_DOCUMENTS = 1000
"""Documents per rerank request (Cohere's recommended most)."""

MAX_TOTAL_TOKENS = 65536
"""Tokens per request, all inputs together after truncation (token-id inputs are counted
by the API node, text by the runner)."""

MAX_DIMENSIONS = 65536
"""The largest ``dimensions`` accepted before the model's width is known."""

MAX_TOKEN_ID = (1 << 31) - 1
"""A token id must be in ``[0, MAX_TOKEN_ID]`` (the runner checks the model's vocabulary)."""

BATCH_TOKENS = 4096
"""The runner forwards a request's inputs in batches of at most this many padded tokens
(rows × longest row), the embedding counterpart of the prefill budget: the activation
memory of one forward stays bounded whatever the request."""


class EmbedBoundError(ValueError):
    """An input or a request over a bound: answered as a 400 with ``param``."""

    def __init__(self, message: str, param: str = "input") -> None:
        super().__init__(message)
        self.param = param


def fit_lengths(lengths: list[int], context: int, *, truncate: bool) -> list[int]:
    """Each input's token count after the context rule: over ``context`` it is cut to it when
    ``truncate``, else ``EmbedBoundError``; an empty input (0 tokens) is an error; the sum
    over ``MAX_TOTAL_TOKENS`` is an error."""
    out: list[int] = []
    for i, n in enumerate(lengths):
        if n <= 0:
            raise EmbedBoundError(f"input {i} is empty (0 tokens)")
        if n > context and not truncate:
            raise EmbedBoundError(f"input {i} has {n} tokens, over the model's context of {context} tokens "
                                  "(ask truncate to cut it)")
        out.append(min(n, context))
    if sum(out) > MAX_TOTAL_TOKENS:
        raise EmbedBoundError(f"the inputs have {sum(out)} tokens together, over {MAX_TOTAL_TOKENS} per request")
    return out


def batches(lengths: list[int], budget: int = BATCH_TOKENS) -> list[list[int]]:
    """The inputs' indices in forward batches: in order, each batch's rows × its longest row
    at most ``budget`` (an input alone over it is a batch of its own). Right-padded rows in a
    batch give the same vectors as alone (``exo_p2p.embeddings.vectors``)."""
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        wider = max(longest, n)
        if current and wider * (len(current) + 1) > budget:
            groups.append(current)
            current, wider = [], n
        current.append(i)
        longest = wider
    if current:
        groups.append(current)
    return groups
