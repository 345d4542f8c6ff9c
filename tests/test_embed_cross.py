"""A BERT cross-encoder (``BertForSequenceClassification``) reranks in-process as transformers'
head computes it (docs/api.md#embeddings-and-reranking): the runner's scores equal the
oracle's (``tests.support.models.synthetic_encoder.cross_encoder_oracle``: the tokenizer's own pairs, the
library's pooler, the classifier in numpy) within 1e-5 and order the documents alike; two
labels score by the last label's softmax, an ``Identity`` activation by the raw logit; other
families, a mismatched head and embedding requests are refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

from exo_p2p.embeddings.bounds import EmbedBoundError
from exo_p2p.types import Embedding, EmbeddingParams
from tests.support.models.synthetic_encoder import cross_encoder_oracle, make_cross_encoder
from worker.embed.build import cross_embedder
from worker.embed.cross import CrossEncoderError, pair_row

pytest.importorskip("mlx_embeddings", reason="the embeddings extra (scripts/install.sh --test installs it)")

ARCH = "BertForSequenceClassification"
QUERY = "what is the capital of france"
DOCS = ["fish swim", "paris is the capital of france", "hello world", "a cat sat on the mat", "the capital"]


def _tok(path):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    return lambda text: tok.encode(text).ids


def test_scores_equal_the_oracle(tmp_path):
    path = make_cross_encoder(tmp_path / "ce")
    embedder, tok = cross_embedder(path, ARCH), _tok(path)
    scores = embedder.rerank(tok(QUERY), [tok(d) for d in DOCS])
    oracle = cross_encoder_oracle(path, QUERY, DOCS)
    np.testing.assert_allclose(scores, oracle, atol=1e-5)
    assert np.argsort(-scores, kind="stable").tolist() == np.argsort(-oracle, kind="stable").tolist()
    assert len(set(np.round(scores, 4).tolist())) == len(DOCS)  # the documents score apart: the order means something
    alone = [embedder.rerank(tok(QUERY), [tok(d)])[0] for d in DOCS]  # right padding: a pair alone = in a batch
    np.testing.assert_allclose(alone, scores, atol=1e-5)


def test_two_labels_and_an_identity_activation(tmp_path):
    two = make_cross_encoder(tmp_path / "two", labels=2)
    embedder, tok = cross_embedder(two, ARCH), _tok(two)
    pooled = embedder.pooled([pair_row(tok(QUERY), tok(d)) for d in DOCS])
    logits = np.tanh(pooled @ embedder.head.pooler_w.T + embedder.head.pooler_b) @ embedder.head.classifier_w.T \
        + embedder.head.classifier_b
    softmax = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(embedder.rerank(tok(QUERY), [tok(d) for d in DOCS]), softmax[:, 1], atol=1e-5)
    one = make_cross_encoder(tmp_path / "one")
    config = json.loads((one / "config.json").read_text())
    config["sentence_transformers"] = {"activation_fn": "torch.nn.modules.linear.Identity"}
    (one / "config.json").write_text(json.dumps(config))
    raw = cross_embedder(one, ARCH).rerank(tok(QUERY), [tok(d) for d in DOCS])
    np.testing.assert_allclose(1 / (1 + np.exp(-raw)), cross_encoder_oracle(one, QUERY, DOCS), atol=1e-5)


def test_pairs_and_refusals(tmp_path):
    assert pair_row((2, 10, 3), (2, 20, 21, 3)) == [2, 10, 3, 20, 21, 3]  # [CLS] q [SEP] d [SEP]
    assert pair_row((2, 10, 3), (20, 3)) == [2, 10, 3, 20, 3]
    path = make_cross_encoder(tmp_path / "ce")
    task = Embedding(task_id="t", instance_id="i", model_id="ce", api_node_id="n",
                     params=EmbeddingParams(inputs=((2, 10, 3),)))
    with pytest.raises(EmbedBoundError, match="cross-encoder"):
        cross_embedder(path, ARCH).task_rows(task)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "xlm-roberta"}))
    with pytest.raises(CrossEncoderError, match="only unquantized BERT"):
        cross_embedder(path, "XLMRobertaForSequenceClassification")
    (path / "config.json").write_text(json.dumps({**config, "id2label": {"0": "a", "1": "b", "2": "c"}}))
    with pytest.raises(CrossEncoderError, match="does not match 3 labels"):
        cross_embedder(path, ARCH)


def test_a_config_that_lies_is_refused_before_it_is_parsed(tmp_path):
    """The cross-encoder's ``config.json`` is read through the bounded, depth-checked model JSON
    reader (docs/security.md#model-sources): too large, too deep or not an object is an error
    naming the file, never a runner exhausting memory or recursion; ``cross_encoder`` (which
    builder runs the model) answers None for it, and the load then says why."""
    from exo_p2p.models.errors import UnsupportedModelError
    from exo_p2p.models.hub_limits import MAX_CONFIG_BYTES
    from worker.embed.engine import cross_encoder

    path = make_cross_encoder(tmp_path / "ce")
    config = (path / "config.json").read_text()
    for lie, why in ((" " * MAX_CONFIG_BYTES + config, "larger than"), ("[" * 200_000, "deeper than")):
        (path / "config.json").write_text(lie)
        with pytest.raises(UnsupportedModelError, match=why):
            cross_embedder(path, ARCH)
        assert cross_encoder(str(path)) is None
    (path / "config.json").write_text("[1, 2]")
    with pytest.raises(CrossEncoderError, match="not an object"):
        cross_embedder(path, ARCH)
    assert cross_encoder(str(path)) is None
