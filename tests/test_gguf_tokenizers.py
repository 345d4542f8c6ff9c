"""GGUF tokenizers against a reference: SentencePiece vocabularies (``tokenizer.ggml.model ==
"llama"``) built into a ``tokenizer.json`` give the ids of the ``sentencepiece`` library
on models it trains here (llama.cpp's SentencePiece tokenizer merges by the same scores);
the Qwen 2 pre-tokenizer splits digits one by one (exo_p2p/models/gguf/spm.py,
gguf_tokenizer.py)."""

from __future__ import annotations

import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.gguf.tokenizer import check_tokenizer, tokenizer_config, tokenizer_json

spm = pytest.importorskip("sentencepiece")

CORPUS = [
    "the quick brown fox jumps over the lazy dog", "hello world, hello there",
    "a tokenizer merges pairs by score", "numbers 12345 and 678 stay", "the theory of the thing",
    "where there is smoke there is fire", "  two spaces  and\ttabs\nand lines",
] * 20
ALPHABET = "abcdefghijklmnopqrstuvwxyz THE,.0123\n\té😀"


def _trained(add_dummy_prefix: bool) -> "spm.SentencePieceProcessor":
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=model, vocab_size=400, model_type="bpe",
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=add_dummy_prefix, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        user_defined_symbols=["<start_of_turn>"], minloglevel=2, split_digits=True)
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def _metadata(sp, add_dummy_prefix: bool) -> dict:  # type: ignore[no-untyped-def]
    """What llama.cpp's converter writes for a SentencePiece model."""
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        tokens.append(piece)
        scores.append(sp.get_score(i))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
                     else 4 if piece == "<start_of_turn>" else 5 if sp.is_unused(i) else 1)
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.add_bos_token": True,
            "tokenizer.ggml.add_space_prefix": add_dummy_prefix}


@pytest.fixture(scope="module", params=[True, False], ids=["llama-prefix", "gemma-no-prefix"])
def pair(request):  # type: ignore[no-untyped-def]
    sp = _trained(request.param)
    metadata = _metadata(sp, request.param)
    return sp, metadata, Tokenizer.from_str(json.dumps(tokenizer_json(metadata)))


@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet=ALPHABET, max_size=40))
def test_sentencepiece_ids_equal_the_library(pair, text: str) -> None:  # type: ignore[no-untyped-def]
    sp, _, ours = pair
    assert ours.encode(text, add_special_tokens=False).ids == sp.encode(text)


def test_sentencepiece_corpus_and_round_trip(pair) -> None:  # type: ignore[no-untyped-def]
    sp, _, ours = pair
    for text in dict.fromkeys(CORPUS):
        assert ours.encode(text, add_special_tokens=False).ids == sp.encode(text), text
        assert ours.decode(sp.encode(text)) == sp.decode(sp.encode(text))
    # bos first (add_bos_token), the user-defined token stays one token
    ids = ours.encode("hi<start_of_turn>there").ids
    assert ids[0] == 1 and sp.piece_to_id("<start_of_turn>") in ids


def test_sentencepiece_streams_with_mlx_lm(tmp_path, pair) -> None:  # type: ignore[no-untyped-def]
    """The decoder has mlx-lm's SentencePiece shape (its streaming detokenizer then applies)."""
    from mlx_lm.tokenizer_utils import SPMStreamingDetokenizer, load

    sp, metadata, _ = pair
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer_json(metadata)))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(metadata, 512)))
    wrapper = load(tmp_path)
    detok = wrapper.detokenizer
    assert isinstance(detok, SPMStreamingDetokenizer)
    text = "the quick brown fox é😀"
    for token in sp.encode(text):
        detok.add_token(token)
    detok.finalize()
    assert detok.text == sp.decode(sp.encode(text))


def test_qwen2_pretokenizer_splits_digits() -> None:
    from tests.support.models.gguf_files import byte_level_vocab

    tokens, types, merges = byte_level_vocab()
    metadata = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
                "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges}
    tok = Tokenizer.from_str(json.dumps(tokenizer_json(metadata)))
    assert tok.pre_tokenizer.pre_tokenize_str("ab 123")[1:] == [("Ġ", (2, 3)), ("1", (3, 4)), ("2", (4, 5)), ("3", (5, 6))] or \
        [piece for piece, _ in tok.pre_tokenizer.pre_tokenize_str("ab 123")] == ["ab", "Ġ", "1", "2", "3"]
    assert tok.encode(" the").ids == [tokens.index("Ġthe")]


@pytest.mark.parametrize("metadata, named", [
    ({"tokenizer.ggml.model": "rwkv", "tokenizer.ggml.tokens": ["a"]}, "tokenizer model 'rwkv'"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.pre": "falcon"},
     "pre-tokenizer 'falcon'"),
    ({"tokenizer.ggml.model": "llama"}, "no tokenizer.ggml.tokens"),
])
def test_unsupported_tokenizers_are_named(metadata: dict, named: str) -> None:
    with pytest.raises(UnsupportedModelError, match=named):
        check_tokenizer(metadata)
