"""Embeddings and rerank against one real node serving the tiny synthetic encoder and the tiny
synthetic decoder (docs/api.md#embeddings-and-reranking): the ``openai`` client (single, a
batch of 64, base64), ``ollama.embed``, LangChain's ``OpenAIEmbeddings``, ``/v1/rerank`` and
``exo-p2p embed`` give the in-process oracle's vectors (a BERT cross-encoder: its scores, as
transformers' head computes them) (``mlx_embeddings`` for the encoder,
mlx-lm's final hidden state for the decoder); an input's vector is the same alone, in a batch
and beside 8 running chat streams.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest

from exo_p2p.embeddings.vectors import cosine, normalize
from tests.support.models.synthetic_models import make_synthetic_model
from tests.support.cluster import NodeProcess
from tests.support.models.synthetic_encoder import cross_encoder_oracle, make_cross_encoder, make_encoder

pytestmark = pytest.mark.integration
openai = pytest.importorskip("openai")
ollama = pytest.importorskip("ollama")
mlx_embeddings = pytest.importorskip("mlx_embeddings", reason="the embeddings extra (scripts/install.sh --test)")

ENCODER, DECODER, CROSS = "tiny-encoder", "tiny-decoder", "tiny-cross-encoder"
TEXTS = ["hello world", "the cat sat on the mat", "what is the capital of france", "fish swim in the sea"]
MAX_COSINE_DISTANCE = 1e-5


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    make_encoder(models / ENCODER)
    make_cross_encoder(models / CROSS)
    make_synthetic_model(models / DECODER, n_layers=2, hidden_size=64, intermediate_size=128, seed=3)
    n = NodeProcess(tmp_path_factory.mktemp("node"), extra_args=["--models-dir", str(models)])
    try:
        n.start()
        n.place_and_wait(ENCODER, timeout=120)
        n.place_and_wait(DECODER, timeout=120)
        n.place_and_wait(CROSS, timeout=120)
        n.models_dir = models  # type: ignore[attr-defined]
        yield n
    finally:
        n.stop()


@pytest.fixture(scope="module")
def oracle(node):
    model, tok = mlx_embeddings.load(str(node.models_dir / ENCODER))
    return lambda texts: np.array(mlx_embeddings.generate(model, tok, list(texts)).text_embeds)


def _same(ours, expected) -> None:  # type: ignore[no-untyped-def]
    ours, expected = np.asarray(ours, dtype=np.float32), np.asarray(expected, dtype=np.float32)
    assert ours.shape == expected.shape
    for a, b in zip(ours, expected):
        assert 1 - float(cosine(a, b[None, :])[0]) <= MAX_COSINE_DISTANCE


def _client(node):  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_openai_single_batch_of_64_and_base64(node, oracle) -> None:
    oc = _client(node)
    one = oc.embeddings.create(model=ENCODER, input=TEXTS[0])
    _same([one.data[0].embedding], oracle(TEXTS[:1]))
    assert one.usage.prompt_tokens == 4  # [CLS] hello world [SEP]
    batch = [f"{TEXTS[i % 4]} {i}" for i in range(64)]
    many = oc.embeddings.create(model=ENCODER, input=batch)
    assert [d.index for d in many.data] == list(range(64))
    _same([d.embedding for d in many.data], oracle(batch))
    b64 = oc.embeddings.create(model=ENCODER, input=TEXTS, encoding_format="base64")  # asked: given as sent
    _same([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in b64.data], oracle(TEXTS))


def test_ollama_and_langchain(node, oracle) -> None:
    out = ollama.Client(host=node.url, timeout=120).embed(model=ENCODER, input=TEXTS)
    _same(out.embeddings, oracle(TEXTS))
    langchain = pytest.importorskip("langchain_openai")
    emb = langchain.OpenAIEmbeddings(model=ENCODER, base_url=f"{node.url}/v1", api_key="unused",
                                     check_embedding_ctx_length=False, max_retries=0)
    _same(emb.embed_documents(TEXTS), oracle(TEXTS))
    _same([emb.embed_query(TEXTS[1])], oracle(TEXTS[1:2]))


def test_decoder_embeds_its_last_token_hidden_state(node) -> None:
    import mlx.core as mx
    from mlx_lm.utils import load

    model, tok = load(str(node.models_dir / DECODER))
    got = _client(node).embeddings.create(model=DECODER, input=TEXTS)
    for text, d in zip(TEXTS, got.data):
        hidden = np.array(model.model(mx.array([tok.encode(text)])).astype(mx.float32))[0]
        _same([d.embedding], normalize(hidden[-1][None]))


def test_alone_in_a_batch_and_beside_8_chat_streams(node) -> None:
    oc = _client(node)
    alone = [oc.embeddings.create(model=DECODER, input=t).data[0].embedding for t in TEXTS]
    batch = [d.embedding for d in oc.embeddings.create(model=DECODER, input=TEXTS * 4).data]
    errors: list[BaseException] = []

    def chat(i: int) -> None:
        try:
            oc.chat.completions.create(model=DECODER, messages=[{"role": "user", "content": f"count {i}"}],
                                       max_tokens=48, temperature=0)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=chat, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    beside = [d.embedding for d in oc.embeddings.create(model=DECODER, input=TEXTS).data]
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)
    np.testing.assert_allclose(np.array(batch[:4]), np.array(alone), atol=1e-5)
    np.testing.assert_allclose(np.array(batch[4:8]), np.array(alone), atol=1e-5)
    np.testing.assert_allclose(np.array(beside), np.array(alone), atol=1e-5)


def test_rerank_orders_as_the_oracle(node, oracle) -> None:
    query, docs = "what is the capital of france", ["fish swim", "paris is the capital of france", "hello world", "a cat"]
    r = httpx.post(f"{node.url}/v1/rerank", json={"model": ENCODER, "query": query, "documents": docs}, timeout=60)
    assert r.status_code == 200, r.text
    vecs = oracle([query, *docs])
    expected = np.argsort(-cosine(vecs[0], vecs[1:]), kind="stable").tolist()
    assert [x["index"] for x in r.json()["results"]] == expected
    assert r.json()["meta"] == {"scoring": "embedding-cosine"}


def test_a_cross_encoder_reranks_as_its_oracle_and_does_not_embed(node) -> None:
    query, docs = "what is the capital of france", ["fish swim", "paris is the capital of france", "hello world", "a cat"]
    r = httpx.post(f"{node.url}/v1/rerank", json={"model": CROSS, "query": query, "documents": docs}, timeout=60)
    assert r.status_code == 200, r.text
    oracle = cross_encoder_oracle(node.models_dir / CROSS, query, docs)
    results = r.json()["results"]
    assert [x["index"] for x in results] == np.argsort(-oracle, kind="stable").tolist()
    np.testing.assert_allclose([x["relevance_score"] for x in results], np.sort(oracle)[::-1], atol=1e-5)
    assert r.json()["meta"] == {"scoring": "cross-encoder"}
    r = httpx.post(f"{node.url}/v1/embeddings", json={"model": CROSS, "input": "x"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_task"


def test_errors_and_cli(node, oracle) -> None:
    r = httpx.post(f"{node.url}/v1/embeddings", json={"model": ENCODER, "input": "x", "dimensions": 8}, timeout=60)
    assert r.status_code == 400 and "matryoshka" in r.json()["error"]["message"]
    r = httpx.post(f"{node.url}/api/embed", json={"model": ENCODER, "input": "x " * 500, "truncate": False}, timeout=60)
    assert r.status_code == 400 and "context" in r.json()["error"]
    exe = Path(sys.executable).with_name("exo-p2p")
    out = subprocess.run([str(exe), "embed", ENCODER, *TEXTS[:2], "--api", node.url, "--json"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    _same([d["embedding"] for d in json.loads(out.stdout)["data"]], oracle(TEXTS[:2]))
    out = subprocess.run([str(exe), "embed", ENCODER, TEXTS[0], "--api", node.url], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("[0] dim 64: ")
    models = subprocess.run([str(exe), "models", "--api", node.url, "--json"], capture_output=True, text=True, timeout=120)
    tasks = {m["model"]: m["tasks"] for m in json.loads(models.stdout)}
    assert tasks[ENCODER] == ["embed", "rerank"] and tasks[DECODER] == ["generate", "embed", "rerank"]
    assert tasks[CROSS] == ["rerank"]
