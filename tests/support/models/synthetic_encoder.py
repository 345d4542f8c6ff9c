"""A tiny random BERT-shaped encoder on disk in mlx-embeddings' layout, for the embedding
tests and benchmark (docs/testing.md): ``config.json`` (``model_type: bert``),
``model.safetensors`` (seeded random weights of ``mlx_embeddings.models.bert.Model``), and a
WordPiece ``tokenizer.json`` built here with the ``tokenizers`` library (BERT's normaliser and
pre-tokeniser, ``[CLS] … [SEP]`` around every input). Optionally sentence-transformers'
``modules.json`` + ``1_Pooling/config.json`` (+ ``Normalize``) and ``matryoshka_dimensions``.
The same arguments always give byte-identical files.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
WORDS = ("the", "cat", "dog", "sat", "on", "mat", "a", "is", "what", "capital", "of", "france", "paris",
         "hello", "world", "embedding", "vector", "search", "query", "document", "fish", "swim", "sea")


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for piece in (*string.ascii_lowercase, *string.digits, *string.punctuation, *WORDS):
        vocab.setdefault(piece, len(vocab))
    for ch in string.ascii_lowercase + string.digits:
        vocab.setdefault("##" + ch, len(vocab))
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tok.decoder = decoders.WordPiece()
    return tok


def _weights(config: dict, seed: int) -> dict[str, mx.array]:
    from mlx_embeddings.models import bert

    model = bert.Model(bert.ModelArgs.from_dict(config))
    rng = np.random.default_rng(seed)
    out = {}
    for name, p in tree_flatten(model.parameters()):
        if "LayerNorm" in name:
            value = np.ones(p.shape) if name.endswith("weight") else np.zeros(p.shape)
        else:
            value = rng.normal(0.0, 0.08, p.shape)
        out[name] = mx.array(value.astype(np.float32))
    model.update(tree_unflatten(list(out.items())))
    return out


def make_encoder(out_dir: Path, *, hidden_size: int = 64, n_layers: int = 2, context: int = 128, seed: int = 0,
                 pooling: str | None = None, normalize: bool = True, matryoshka: bool = False) -> Path:
    """Write the encoder into ``out_dir`` and return it. ``pooling`` (``mean``, ``cls``,
    ``lasttoken``) adds sentence-transformers' modules with that Pooling module (and a
    Normalize module when ``normalize``); None leaves them out (the library's mean pooling,
    normalised). ``matryoshka`` lists ``matryoshka_dimensions`` in ``config.json``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer()
    config = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": hidden_size,
              "num_hidden_layers": n_layers, "num_attention_heads": 4, "intermediate_size": hidden_size * 2,
              "max_position_embeddings": context, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
              "vocab_size": tok.get_vocab_size()}
    if matryoshka:
        config["matryoshka_dimensions"] = [hidden_size // 4, hidden_size // 2, hidden_size]
    mx.save_safetensors(str(out_dir / "model.safetensors"), _weights(config, seed))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": context, "do_lower_case": True,
        "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]",
    }, indent=2))
    if pooling is not None:
        modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        if normalize:
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (out_dir / "modules.json").write_text(json.dumps(modules, indent=2))
        (out_dir / "1_Pooling").mkdir(exist_ok=True)
        (out_dir / "1_Pooling" / "config.json").write_text(json.dumps({
            "word_embedding_dimension": hidden_size, "pooling_mode_cls_token": pooling == "cls",
            "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_lasttoken": pooling == "lasttoken"}, indent=2))
    return out_dir


def make_cross_encoder(out_dir: Path, *, hidden_size: int = 64, n_layers: int = 2, context: int = 128,
                       seed: int = 1, labels: int = 1) -> Path:
    """A tiny random BERT cross-encoder in transformers' ``BertForSequenceClassification``
    layout: ``config.json`` (``architectures: [BertForSequenceClassification]``, ``labels``
    entries in ``id2label``), ``model.safetensors`` with the encoder and pooler under ``bert.``
    and the ``classifier`` head ``[labels, hidden]``, and the WordPiece tokenizer (its pair
    template ``[CLS] A [SEP] B [SEP]``, token types 0 then 1). Byte-identical for the same
    arguments."""
    out_dir = make_encoder(out_dir, hidden_size=hidden_size, n_layers=n_layers, context=context, seed=seed)
    config = json.loads((out_dir / "config.json").read_text())
    config.update(architectures=["BertForSequenceClassification"],
                  id2label={str(i): f"LABEL_{i}" for i in range(labels)}, label2id={f"LABEL_{i}": i for i in range(labels)})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    rng = np.random.default_rng(seed + 1000)
    weights = {f"bert.{k}": v for k, v in mx.load(str(out_dir / "model.safetensors")).items()}
    weights["classifier.weight"] = mx.array(rng.normal(0.0, 0.3, (labels, hidden_size)).astype(np.float32))
    weights["classifier.bias"] = mx.array(rng.normal(0.0, 0.1, (labels,)).astype(np.float32))
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights)
    return out_dir


def cross_encoder_oracle(model_dir: Path, query: str, documents: list[str]) -> np.ndarray:
    """``[len(documents)]`` relevance scores of a one-label BERT cross-encoder computed as
    transformers' ``BertForSequenceClassification`` does, independently of the runner: each
    pair encoded by the ``tokenizers`` library (its pair template and type ids), the library's
    BERT (``mlx_embeddings``) and its ``pooler_output``, then the classifier and a sigmoid in
    numpy from the safetensors file."""
    from mlx_embeddings.models import bert
    from tokenizers import Tokenizer

    config = json.loads((model_dir / "config.json").read_text())
    weights = mx.load(str(model_dir / "model.safetensors"))
    w, b = np.array(weights.pop("classifier.weight")), np.array(weights.pop("classifier.bias"))
    model = bert.Model(bert.ModelArgs.from_dict(config))
    model.load_weights([(k.removeprefix("bert."), v) for k, v in weights.items()])
    model.eval()  # no dropout
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    scores = []
    for doc in documents:
        enc = tok.encode(query, doc)
        out = model(mx.array([enc.ids]), token_type_ids=mx.array([enc.type_ids]))
        logit = float((np.array(out.pooler_output) @ w.T + b)[0, 0])
        scores.append(1.0 / (1.0 + np.exp(-logit)))
    return np.array(scores, dtype=np.float32)
