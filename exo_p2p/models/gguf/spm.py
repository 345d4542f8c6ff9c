"""A ``tokenizer.json`` for a SentencePiece GGUF (``tokenizer.ggml.model == "llama"``).

llama.cpp's SentencePiece tokenizer merges, over and over, the adjacent pair whose joined
text is a token of highest score, and falls back to ``<0xXX>`` byte tokens for what no token
covers. The ``tokenizers`` library does the same with a BPE model whose merges are ordered
by the score of what they make (``byte_fallback``), as Hugging Face converts Llama's and
Gemma's SentencePiece models: :func:`spm_merges` builds that list from the GGUF's tokens and
scores. Spaces become ``▁``; with ``tokenizer.ggml.add_space_prefix`` (default true, false
for Gemma) one ``▁`` is put first. The decoder is mlx-lm's SentencePiece shape, so it
streams with ``SPMStreamingDetokenizer``. Checked against the ``sentencepiece`` library on
models it trains (tests/test_gguf_tokenizers.py).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_CONTROL = 1, 2, 3
TOKEN_TYPE_USER_DEFINED, TOKEN_TYPE_BYTE = 4, 6

SPACE = "▁"
"""SentencePiece's visible space (U+2581)."""


def spm_merges(tokens: Sequence[str], scores: Sequence[float], types: Sequence[int]) -> list[list[str]]:
    """Every merge ``[left, right]`` whose joined text is a normal token, both sides tokens,
    ordered by the joined token's score (highest first), then by the sides' ids (the order of
    Hugging Face's ``SentencePieceExtractor``). O(total characters of the vocabulary)."""
    ids = {t: i for i, t in enumerate(tokens) if types[i] != TOKEN_TYPE_CONTROL}
    found: list[tuple[float, int, int, str, str]] = []
    for i, token in enumerate(tokens):
        if types[i] != TOKEN_TYPE_NORMAL or len(token) < 2:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids:
                found.append((-float(scores[i]), ids[left], ids[right], left, right))
    found.sort()
    return [[left, right] for _, _, _, left, right in found]


def spm_tokenizer_json(metadata: Mapping[str, Any], added: list[dict[str, Any]],
                       post_processor: dict[str, Any] | None) -> dict[str, Any]:
    """The ``tokenizer.json`` of a SentencePiece GGUF: BPE with byte fallback over the GGUF's
    tokens, merges from :func:`spm_merges`, ``added`` (control and user-defined tokens) as
    added tokens, and ``post_processor`` (the bos template, or None)."""
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    scores = metadata.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    types = list(metadata.get("tokenizer.ggml.token_type", [TOKEN_TYPE_NORMAL] * len(tokens)))
    prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
    normalizer = ({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPACE}, replace]}
                  if prefix else replace)
    decoders: list[dict[str, Any]] = [
        {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"}]
    if prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": None,
        "post_processor": post_processor,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE", "dropout": None,
            "unk_token": tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None,
            "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
            "byte_fallback": True, "ignore_merges": False,
            "vocab": {token: i for i, token in enumerate(tokens)},
            "merges": spm_merges(tokens, scores, types),
        },
    }
