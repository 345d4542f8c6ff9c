"""The runner's embedding work in-process against its oracles (docs/api.md#embeddings-and-reranking):
encoders equal ``mlx_embeddings``' own embedding of the same text, decoders mlx-lm's final
hidden state; a row's vector is the same alone and in a batch; rerank orders documents as the
oracle's cosine does."""

from __future__ import annotations

import numpy as np
import pytest

from exo_p2p.embeddings.bounds import EmbedBoundError
from exo_p2p.embeddings.vectors import cosine, normalize
from tests.support.models.synthetic_families import FAMILIES, make_family_model
from tests.support.models.synthetic_encoder import make_encoder
from worker.embed.build import decoder_embedder, encoder_embedder
from worker.engine.loading.loader import load_all

mlx_embeddings = pytest.importorskip("mlx_embeddings", reason="the embeddings extra (scripts/install.sh --test installs it)")

TEXTS = ["hello world", "the cat sat on the mat", "what is the capital of france", "a", "fish swim in the sea " * 5]
MAX_COSINE_DISTANCE = 1e-5


def _close(a: np.ndarray, b: np.ndarray) -> None:
    for x, y in zip(a, b):
        assert 1 - float(cosine(x, y[None, :])[0]) <= MAX_COSINE_DISTANCE


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    path = make_encoder(tmp_path_factory.mktemp("enc") / "bert")
    embedder, tokenizer = encoder_embedder(path)
    return path, embedder, tokenizer


def test_encoder_equals_the_library(encoder):
    path, embedder, tokenizer = encoder
    model, tok = mlx_embeddings.load(str(path))
    oracle = np.array(mlx_embeddings.generate(model, tok, TEXTS).text_embeds)
    rows = [tokenizer.encode(t) for t in TEXTS]
    _close(embedder.embed(rows), oracle)
    for text, expected in zip(TEXTS, oracle):  # the library alone, one text at a time
        alone = np.array(mlx_embeddings.generate(model, tok, [text]).text_embeds)[0]
        _close(expected[None], alone[None])


def test_alone_equals_in_a_batch(encoder):
    _, embedder, tokenizer = encoder
    rows = [tokenizer.encode(t) for t in TEXTS] * 13  # 65 rows, several forward batches
    batch = embedder.embed(rows)
    for i, row in enumerate(rows[: len(TEXTS)]):
        alone = embedder.embed([row])
        np.testing.assert_allclose(batch[i], alone[0], atol=1e-6)
        np.testing.assert_allclose(batch[i + len(TEXTS)], alone[0], atol=1e-6)


def test_sentence_transformers_pooling_and_matryoshka(tmp_path):
    path = make_encoder(tmp_path / "st", pooling="cls", normalize=False, matryoshka=True)
    embedder, tokenizer = encoder_embedder(path)
    model, tok = mlx_embeddings.load(str(path))
    row = tokenizer.encode("hello world")
    import mlx.core as mx

    hidden = np.array(model(mx.array([row])).last_hidden_state)[0]
    np.testing.assert_allclose(embedder.embed([row])[0], hidden[0], rtol=1e-5, atol=1e-6)  # CLS, not normalised
    assert embedder.embed([row], dimensions=16).shape == (1, 16)
    with pytest.raises(EmbedBoundError, match="width"):
        embedder.embed([row], dimensions=65)
    plain, _ = encoder_embedder(make_encoder(tmp_path / "plain"))
    with pytest.raises(EmbedBoundError, match="matryoshka"):
        plain.embed([row], dimensions=16)


def test_runner_guards(encoder):
    _, embedder, _ = encoder
    with pytest.raises(EmbedBoundError, match="vocabulary"):
        embedder.embed([[embedder.vocab]])
    with pytest.raises(EmbedBoundError, match="context"):
        embedder.embed([[5] * (embedder.context + 1)])


def test_rerank_orders_as_the_oracle(encoder):
    path, embedder, tokenizer = encoder
    model, tok = mlx_embeddings.load(str(path))
    query, docs = "what is the capital of france", ["fish swim", "paris is the capital of france", "hello world", "a cat"]
    vecs = np.array(mlx_embeddings.generate(model, tok, [query, *docs]).text_embeds)
    oracle = cosine(vecs[0], vecs[1:])
    scores = embedder.rerank(tokenizer.encode(query), [tokenizer.encode(d) for d in docs])
    assert list(np.argsort(-scores)) == list(np.argsort(-oracle))
    np.testing.assert_allclose(scores, oracle, atol=1e-5)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_decoder_equals_mlx_lm_hidden_state(tmp_path, family):
    import mlx.core as mx
    from mlx_lm.utils import load

    path = make_family_model(tmp_path / family, family)
    loaded = load_all(path)
    embedder = decoder_embedder(loaded)
    model, tok = load(str(path))
    rows = [tok.encode(t) for t in TEXTS]
    ours = embedder.embed(rows)
    for row, vec in zip(rows, ours):
        hidden = np.array(model.model(mx.array([row])).astype(mx.float32))[0]
        _close(vec[None], normalize(hidden[-1][None]))


def test_embed_work_steps_a_request_in_bounded_batches(encoder):
    from exo_p2p.types import Embedding, EmbeddingChunk, EmbeddingParams, FinishChunk, Rerank, RerankParams
    from worker.embed.work import EmbedWork

    _, embedder, tokenizer = encoder
    rows = tuple(tuple(tokenizer.encode(t)) for t in TEXTS * 4)
    work = EmbedWork(embedder, step_tokens=64)
    work.submit(Embedding(task_id="e", instance_id="i", model_id="m", params=EmbeddingParams(inputs=rows), api_node_id="n"))
    work.submit(Embedding(task_id="bad", instance_id="i", model_id="m",
                          params=EmbeddingParams(inputs=((embedder.vocab,),)), api_node_id="n"))
    work.submit(Rerank(task_id="r", instance_id="i", model_id="m",
                       params=RerankParams(query=rows[2], documents=rows[:4]), api_node_id="n"))
    work.submit(Embedding(task_id="gone", instance_id="i", model_id="m", params=EmbeddingParams(inputs=rows[:1]), api_node_id="n"))
    work.cancel("gone")
    chunks, steps = [], 0
    while work.has_work() and steps < 50:
        chunks += work.step()
        steps += 1
    assert steps > 3  # one request took several steps: decode steps can run between them
    by_task = {}
    for c in chunks:
        by_task.setdefault(c.task_id, []).append(c)
    vec = by_task["e"][0]
    assert isinstance(vec, EmbeddingChunk) and isinstance(by_task["e"][1], FinishChunk)
    got = np.frombuffer(vec.vectors, "<f4").reshape(vec.count, vec.dimensions)
    np.testing.assert_allclose(got, embedder.embed(rows), atol=1e-6)
    assert by_task["bad"][0].error.status == 400
    assert by_task["gone"][0].finish_reason == "cancelled"
    scores = np.frombuffer(by_task["r"][0].vectors, "<f4")
    np.testing.assert_allclose(scores, embedder.rerank(rows[2], rows[:4]), atol=1e-6)


def test_vectors_over_a_chunk_s_bytes_come_in_parts_in_order(encoder, monkeypatch):
    """A task's rows travel in ``EmbeddingChunk`` parts of at most ``EMBEDDING_CHUNK_BYTES``
    (here 3 rows' worth), in order, then one ``FinishChunk``; joined they are the rows."""
    from exo_p2p.types import Embedding, EmbeddingChunk, EmbeddingParams, FinishChunk
    from worker.embed import work as work_module

    _, embedder, tokenizer = encoder
    rows = tuple(tuple(tokenizer.encode(t)) for t in TEXTS * 2)
    width = embedder.embed(rows[:1]).shape[1]
    monkeypatch.setattr(work_module, "EMBEDDING_CHUNK_BYTES", 3 * 4 * width + 5)
    work = work_module.EmbedWork(embedder)
    work.submit(Embedding(task_id="e", instance_id="i", model_id="m", params=EmbeddingParams(inputs=rows), api_node_id="n"))
    chunks: list = []
    for _ in range(50):
        if not work.has_work():
            break
        chunks += work.step()
    parts, finish = chunks[:-1], chunks[-1]
    assert isinstance(finish, FinishChunk) and all(isinstance(c, EmbeddingChunk) for c in parts)
    assert [c.count for c in parts] == [3] * (len(rows) // 3) + ([len(rows) % 3] if len(rows) % 3 else [])
    got = np.concatenate([np.frombuffer(c.vectors, "<f4").reshape(c.count, c.dimensions) for c in parts])
    np.testing.assert_allclose(got, embedder.embed(rows), atol=1e-6)


def test_a_decoder_runner_paces_embeddings_while_rows_decode():
    import time
    from types import SimpleNamespace

    from worker.embed.work import EMBED_SHARE
    from worker.engine.text import TextEngine

    class Decoding:  # a scheduler whose rows decode for 1 ms a step
        batch = SimpleNamespace(rows=[object()])
        slots = SimpleNamespace(hold_long=False, long_fed=False)

        def has_work(self) -> bool:
            return True

        def step(self) -> list:
            time.sleep(0.001)
            return []

    class Embedding:  # embedding batches of 10 ms each, always more
        steps = 0

        def has_work(self) -> bool:
            return True

        def step(self) -> list:
            self.steps += 1
            time.sleep(0.01)
            return []

    embed = Embedding()
    engine = TextEngine(Decoding(), embed=embed)  # type: ignore[arg-type]
    started = time.monotonic()
    for _ in range(400):
        engine.step()
    spent = time.monotonic() - started
    assert 0 < embed.steps * 0.01 / spent <= EMBED_SHARE + 0.1  # ~0.2 of the time, never all of it
    Decoding.batch.rows = []  # nothing decodes: an embedding batch every step
    before = embed.steps
    for _ in range(10):
        engine.step()
    assert embed.steps - before == 10


def test_a_cross_encoder_is_found_by_its_architecture(tmp_path):
    import json

    from worker.embed.engine import cross_encoder

    path = make_encoder(tmp_path / "ce")
    assert cross_encoder(str(path)) is None
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "architectures": ["BertForSequenceClassification"]}))
    assert cross_encoder(str(path)) == "BertForSequenceClassification"
