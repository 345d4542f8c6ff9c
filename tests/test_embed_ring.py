"""A decoder split over two real nodes embeds as one node does (docs/api.md#embeddings-and-reranking):
a 2-node pipeline instance (the last rank pools, its vectors summed to rank 0 over the ring)
and a 2-node tensor instance of the tiny synthetic decoder give, for single inputs, a batch
of mixed lengths, a batch beside running chat streams and a rerank, mlx-lm's final hidden state of the whole model in-process
(cosine distance <= 1e-5), and the same vectors as the model placed on one node.
"""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import pytest

from exo_p2p.embeddings.vectors import cosine, normalize
from tests.support.cluster import Cluster, NodeProcess, wait_until
from tests.support.models.synthetic_models import make_synthetic_model

pytestmark = pytest.mark.integration

MODEL = "tiny-ring"
TEXTS = ["hello world", "the cat sat on the mat", "what is the capital of france", "fish swim in the sea " * 6]
MAX_COSINE_DISTANCE = 1e-5


def _oracle(model_dir) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The normalised last-token hidden state of each of ``TEXTS``, mlx-lm in-process."""
    import mlx.core as mx
    from mlx_lm.utils import load

    model, tok = load(str(model_dir))
    rows = [np.array(model.model(mx.array([tok.encode(t)])).astype(mx.float32))[0][-1] for t in TEXTS]
    return normalize(np.stack(rows))


def _close(ours, expected) -> float:  # type: ignore[no-untyped-def]
    """The largest cosine distance between rows (asserted within ``MAX_COSINE_DISTANCE``)."""
    ours, expected = np.asarray(ours, dtype=np.float32), np.asarray(expected, dtype=np.float32)
    assert ours.shape == expected.shape
    worst = max(1 - float(cosine(a, b[None, :])[0]) for a, b in zip(ours, expected))
    assert worst <= MAX_COSINE_DISTANCE, worst
    return worst


def _embed(node: NodeProcess, texts) -> np.ndarray:  # type: ignore[no-untyped-def]
    r = httpx.post(f"{node.url}/v1/embeddings", json={"model": MODEL, "input": texts}, timeout=120)
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


def _vectors(node: NodeProcess) -> np.ndarray:
    """``TEXTS`` embedded one at a time and as one batch (the same vectors either way)."""
    alone = np.concatenate([_embed(node, t) for t in TEXTS])
    np.testing.assert_allclose(_embed(node, TEXTS), alone, atol=1e-5)
    return alone


def _beside_chats(node: NodeProcess, streams: int = 4) -> np.ndarray:
    """``TEXTS`` embedded while ``streams`` chat requests decode on the same instance (the
    ranks pace the embedding by the agreed hold, so they step alike)."""
    errors: list[BaseException] = []

    def chat(i: int) -> None:
        try:
            r = node.chat(f"count to {i}", MODEL, max_tokens=40, temperature=0)
            assert r.status_code == 200, r.text
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=chat, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    vectors = _embed(node, TEXTS)
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads), errors
    return vectors


def _rerank(node: NodeProcess) -> list[int]:
    r = httpx.post(f"{node.url}/v1/rerank", json={"model": MODEL, "query": TEXTS[2], "documents": TEXTS}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["meta"] == {"scoring": "embedding-cosine"}
    return [x["index"] for x in r.json()["results"]]


def _place(node: NodeProcess, **body) -> str:  # type: ignore[no-untyped-def]
    return node.place_and_wait(MODEL, timeout=120, **body)["instance_id"]


def test_pipeline_and_tensor_instances_embed_as_one_node(tmp_path) -> None:
    models = tmp_path / "models"
    make_synthetic_model(models / MODEL, n_layers=4, hidden_size=64, intermediate_size=128, seed=5)
    oracle = _oracle(models / MODEL)
    expected_order = np.argsort(-cosine(oracle[2], oracle), kind="stable").tolist()
    cluster = Cluster(tmp_path, 2, extra_args=["--models-dir", str(models)])
    try:
        a, b = cluster.start().nodes
        single = _place(a, min_nodes=1)
        started = time.monotonic()
        one_node = _vectors(b)
        print(f"\none node: {len(TEXTS)} inputs alone and as a batch in {time.monotonic() - started:.2f} s")
        _close(one_node, oracle)
        assert _rerank(b) == expected_order
        assert httpx.delete(f"{a.url}/instances/{single}", timeout=30).status_code == 200
        for sharding in ("pipeline", "tensor"):
            instance = _place(a, min_nodes=2, sharding=sharding)
            assert len(a.get("/state").json()["instances"][instance]["shards"]) == 2
            started = time.monotonic()
            split = _vectors(b)  # the API on the node of rank 1 or 0: either answers with rank 0's
            seconds = time.monotonic() - started
            worst = _close(split, oracle)
            _close(split, one_node)
            _close(_beside_chats(a), one_node)
            assert _rerank(a) == expected_order
            print(f"\n{sharding}: the same in {seconds:.2f} s; largest cosine distance to the oracle {worst:.2e}, "
                  f"largest difference from one node's values {np.abs(split - one_node).max():.2e}")
            assert httpx.delete(f"{a.url}/instances/{instance}", timeout=30).status_code == 200
            wait_until(lambda: not a.get("/state").json()["instances"], 60, what="instance gone")
    finally:
        cluster.stop()
