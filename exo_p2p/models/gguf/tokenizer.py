"""Hugging Face tokenizer files built from a GGUF's ``tokenizer.ggml.*`` metadata.

Produces ``tokenizer.json`` (a byte-level BPE for the ``tokenizers`` library),
``tokenizer_config.json`` (with the GGUF's ``tokenizer.chat_template``),
``special_tokens_map.json`` and ``generation_config.json``. Token ids match llama.cpp's
tokenizer on the same GGUF with special tokens parsed (checked against
``tests/data/smollm2-tokenizer.json``): control tokens such as ``<|im_start|>`` are
added tokens, so they stay single tokens.

Supported: ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE) with the pre-tokenizers in
:data:`PRE_TOKENIZERS`, and ``"llama"`` (SentencePiece: :mod:`exo_p2p.models.gguf.spm`).
Other kinds raise :class:`UnsupportedModelError` naming the kind.
"""

from __future__ import annotations

from typing import Any, Mapping

from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.gguf.spm import spm_tokenizer_json

TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED = 1, 2, 3, 4
"""llama.cpp token types (``tokenizer.ggml.token_type``)."""

END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>")
"""Tokens that end generation when present in the vocabulary, besides ``eos_token_id``."""

_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
               "use_regex": True}
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _split_then_bytes(pattern: str) -> dict[str, Any]:
    """Split on ``pattern`` (kept, isolated), then byte level without the GPT-2 regex."""
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {**_BYTE_LEVEL, "use_regex": False}]}


PRE_TOKENIZERS: dict[str, dict[str, Any]] = {
    # llama.cpp "smollm": each digit alone ("\p{N}"), then the GPT-2 regex + byte level.
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, _BYTE_LEVEL]},
    # GPT-2 regex + byte level.
    "gpt-2": _BYTE_LEVEL,
    "default": _BYTE_LEVEL,
    # Llama 3: numbers in groups of up to three, then byte level without the GPT-2 regex.
    "llama-bpe": _split_then_bytes(_LLAMA3_SPLIT),
    # Qwen 2/2.5/3: each digit alone, then byte level without the GPT-2 regex.
    "qwen2": _split_then_bytes(_QWEN2_SPLIT),
}
"""``tokenizer.ggml.pre`` -> ``tokenizers`` pre-tokenizer (after llama.cpp's llama-vocab.cpp)."""


TOKENIZER_MODELS = ("gpt2", "llama")
"""``tokenizer.ggml.model`` values the importer reads: byte-level BPE, SentencePiece."""


def check_tokenizer(metadata: Mapping[str, Any]) -> None:
    """Whether :func:`tokenizer_json` can build this GGUF's tokenizer, cheaply (at listing
    time, before any import).

    Raises:
        UnsupportedModelError: another tokenizer model, no token list, or an unknown
            ``tokenizer.ggml.pre`` (each named).
    """
    model = metadata.get("tokenizer.ggml.model")
    if model not in TOKENIZER_MODELS:
        raise UnsupportedModelError(
            f"GGUF tokenizer model {model!r} is not supported (supported: 'gpt2' byte-level "
            "BPE, 'llama' SentencePiece)")
    if not metadata.get("tokenizer.ggml.tokens"):
        raise UnsupportedModelError("GGUF has no tokenizer.ggml.tokens")
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if model == "gpt2" and pre not in PRE_TOKENIZERS:
        raise UnsupportedModelError(
            f"GGUF pre-tokenizer {pre!r} is not supported (supported: {', '.join(PRE_TOKENIZERS)})")


def tokenizer_json(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The ``tokenizer.json`` of a GGUF: byte-level BPE (``gpt2``) or SentencePiece
    (``llama``), control and user-defined tokens as added tokens (control ones special).

    Raises:
        UnsupportedModelError: as :func:`check_tokenizer`.
    """
    check_tokenizer(metadata)
    model = metadata.get("tokenizer.ggml.model")
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    types = _token_types(metadata)
    added = [
        {"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": types[i] != TOKEN_TYPE_USER_DEFINED}
        for i in range(len(tokens)) if types[i] in _ADDED_TYPES
    ]
    if model == "llama":
        return spm_tokenizer_json(metadata, added, _post_processor(metadata, tokens, None))
    pre = metadata.get("tokenizer.ggml.pre", "default")
    merges = [merge.split(" ", 1) for merge in metadata.get("tokenizer.ggml.merges", [])]
    byte_level = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                  "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": _post_processor(metadata, tokens, byte_level),
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None,
            "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
            "byte_fallback": False, "ignore_merges": pre == "llama-bpe",
            "vocab": {token: i for i, token in enumerate(tokens)},
            "merges": merges,
        },
    }


def special_tokens(metadata: Mapping[str, Any]) -> dict[str, str]:
    """``bos_token``/``eos_token``/``pad_token``/``unk_token`` -> token text, for those whose
    id the GGUF names (``special_tokens_map.json``)."""
    tokens = metadata["tokenizer.ggml.tokens"]
    out = {}
    for role in ("bos", "eos", "pad", "unk"):
        key = "padding" if role == "pad" else ("unknown" if role == "unk" else role)
        token_id = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None and 0 <= token_id < len(tokens):
            out[f"{role}_token"] = tokens[token_id]
    return out


def tokenizer_config(metadata: Mapping[str, Any], context_length: int) -> dict[str, Any]:
    """``tokenizer_config.json``: special tokens, ``chat_template`` (from
    ``tokenizer.chat_template``, omitted when absent), bos/eos flags, max length in tokens."""
    tokens = metadata["tokenizer.ggml.tokens"]
    types = _token_types(metadata)
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": _adds_bos(metadata),
        "add_eos_token": bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        "added_tokens_decoder": {
            str(i): {"content": tokens[i], "lstrip": False, "normalized": False,
                     "rstrip": False, "single_word": False,
                     "special": types[i] != TOKEN_TYPE_USER_DEFINED}
            for i in range(len(tokens)) if types[i] in _ADDED_TYPES
        },
        **special_tokens(metadata),
        "clean_up_tokenization_spaces": False,
        "model_max_length": context_length,
    }
    if template := metadata.get("tokenizer.chat_template"):
        config["chat_template"] = template
    return config


def end_of_turn_ids(metadata: Mapping[str, Any]) -> list[int]:
    """Every token id that ends generation: ``eos_token_id``, ``eot_token_id``,
    ``eom_token_id``, then the :data:`END_OF_TURN_TOKENS` present in the vocabulary; no
    duplicates, in that order (SmolLM2: ``[2, 0]``, <|im_end|> then <|endoftext|>)."""
    tokens = metadata["tokenizer.ggml.tokens"]
    ids: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        if (token_id := metadata.get(f"tokenizer.ggml.{key}")) is not None:
            ids.append(int(token_id))
    index = {token: i for i, token in enumerate(tokens) if token in END_OF_TURN_TOKENS}
    ids.extend(index[token] for token in END_OF_TURN_TOKENS if token in index)
    return list(dict.fromkeys(ids))


def generation_config(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``generation_config.json``: bos, pad and the list of end-of-turn ids as
    ``eos_token_id`` (mlx-lm's ``load_config`` reads that list into ``config["eos_token_id"]``
    and stops on each)."""
    config: dict[str, Any] = {}
    if (bos := metadata.get("tokenizer.ggml.bos_token_id")) is not None:
        config["bos_token_id"] = int(bos)
    config["eos_token_id"] = end_of_turn_ids(metadata)
    if (pad := metadata.get("tokenizer.ggml.padding_token_id")) is not None:
        config["pad_token_id"] = int(pad)
    return config


def _token_types(metadata: Mapping[str, Any]) -> list[int]:
    tokens = metadata["tokenizer.ggml.tokens"]
    return list(metadata.get("tokenizer.ggml.token_type", [TOKEN_TYPE_NORMAL] * len(tokens)))


_ADDED_TYPES = (TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)


def _adds_bos(metadata: Mapping[str, Any]) -> bool:
    """``tokenizer.ggml.add_bos_token``; when absent, llama.cpp's default: true for
    SentencePiece vocabularies, false for byte-level BPE."""
    default = metadata.get("tokenizer.ggml.model") == "llama"
    return bool(metadata.get("tokenizer.ggml.add_bos_token", default))


def _post_processor(metadata: Mapping[str, Any], tokens: list[str],
                    otherwise: dict[str, Any] | None) -> dict[str, Any] | None:
    """A template that puts bos first when the GGUF asks for it, else ``otherwise``."""
    bos_id = metadata.get("tokenizer.ggml.bos_token_id")
    if not _adds_bos(metadata) or bos_id is None:
        return otherwise
    bos = tokens[bos_id]
    return {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": bos, "type_id": 1}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }
