"""Token log-probabilities in each API family's shape (the runner computes them:
``worker.engine.token_logprobs`` says which distribution; docs/api.md#logprobs).

``TokenLogprobs`` (one per generated token, the content's and the reasoning's alike) become:
OpenAI chat's and Responses' ``{"token", "logprob", "bytes", "top_logprobs": [...]}``
entries (``openai_entry``), the legacy completions object ``{"tokens", "token_logprobs",
"top_logprobs", "text_offset"}`` (``legacy``), Ollama's ``{"token", "logprob", "bytes",
"top_logprobs"}`` (``ollama_entry``; the same fields). ``bytes`` is the UTF-8 of the token's
text as the tokenizer decodes it alone (a token holding part of a character decodes to
U+FFFD, whose bytes these are). ``requested`` checks a request's fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exo_p2p.api.errors import ApiError
from exo_p2p.types.chunks import TokenLogprob, TokenLogprobs
from exo_p2p.types.tasks import MAX_TOP_LOGPROBS


def requested(enabled: bool | None, top: int | None, *, top_param: str = "top_logprobs",
              enabled_param: str = "logprobs") -> int | None:
    """``GenerationParams.logprobs`` of a request's ``enabled`` flag and ``top`` count: None
    when off, else ``top`` (0 when absent). 400 for ``top`` outside 0..``MAX_TOP_LOGPROBS``
    or given without ``enabled``."""
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise ApiError(400, f"{top_param} must be an integer in 0..{MAX_TOP_LOGPROBS}, not {top!r}", param=top_param,
                       code="invalid_value")
    if not enabled:
        if top:
            raise ApiError(400, f"{top_param} needs {enabled_param} to be true", param=top_param, code="invalid_value")
        return None
    return top or 0


def _one(t: TokenLogprob) -> dict[str, Any]:
    return {"token": t.text, "logprob": t.logprob, "bytes": list(t.text.encode())}


def openai_entry(lp: TokenLogprobs) -> dict[str, Any]:
    """One token's entry of chat's ``logprobs.content`` (and Responses' ``logprobs``)."""
    return {**_one(lp.chosen), "top_logprobs": [_one(t) for t in lp.top]}


ollama_entry = openai_entry
"""Ollama writes the same fields (``token``, ``logprob``, ``bytes``, ``top_logprobs``)."""


def legacy(lps: Sequence[TokenLogprobs], first_offset: int = 0) -> dict[str, Any]:
    """The completions ``logprobs`` object of ``lps``: ``text_offset`` counts characters of
    the completion text from ``first_offset`` (the text before the first of them), each
    token's text taken as it decodes alone."""
    offsets, at = [], first_offset
    for lp in lps:
        offsets.append(at)
        at += len(lp.chosen.text)
    return {"tokens": [lp.chosen.text for lp in lps], "token_logprobs": [lp.chosen.logprob for lp in lps],
            "top_logprobs": [{t.text: t.logprob for t in lp.top} for lp in lps], "text_offset": offsets}
