"""The embedding and rerank endpoints over a fake master (no node): each family's body and
answer, the bounds and errors in each family's shape, the task the API submits, and the clients'
own decoding (OpenAI's base64) (docs/api.md#embeddings-and-reranking)."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import msgspec
import numpy as np
import pytest
import trio

from exo_p2p.api import create_app
from exo_p2p.embeddings.bounds import MAX_INPUTS
from exo_p2p.types import Embedding, EmbeddingChunk, FinishChunk, ModelId, Rerank, SubmitTask
from tests.support.fake_master import MODEL, FakeMaster

ENCODER = "tiny-encoder"
CONTEXT = 16


def _vectors(rows) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The fake runner's vectors: [tokens, first id, sum of ids, 1] per row."""
    return np.array([[len(r), r[0], sum(r), 1.0] for r in rows], dtype=np.float32)


class EmbedMaster(FakeMaster):
    """``FakeMaster`` with an encoder card and a runner that answers embeddings and reranks."""

    def __init__(self, nursery) -> None:  # type: ignore[no-untyped-def]
        super().__init__(nursery)
        base = self._state.model_cards[MODEL]
        enc = msgspec.structs.replace(base, model_id=ModelId(ENCODER), tasks=("embed", "rerank"), context_length=CONTEXT,
                                      vocab_size=1000)
        self._state = msgspec.structs.replace(self._state, model_cards={**self._state.model_cards, ENCODER: enc})
        self.script = self._answer

    async def tokenize(self, model_id: str, texts: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        if model_id not in self._state.model_cards:
            raise KeyError(model_id)
        return tuple((101, *(len(w) for w in t.split()), 102) for t in texts)

    def _answer(self, cmd: SubmitTask) -> list:
        task = cmd.task
        if isinstance(task, Embedding):
            rows = task.params.inputs
            vecs = _vectors(rows)[:, : task.params.dimensions or 4]
        else:
            assert isinstance(task, Rerank)
            rows = (task.params.query, *task.params.documents)
            vecs = _vectors(task.params.documents)[:, 2:3]  # score: the sum of the ids
        tokens = sum(len(r) for r in rows)
        return [EmbeddingChunk(task_id=task.task_id, vectors=vecs.astype("<f4").tobytes(), count=vecs.shape[0],
                               dimensions=vecs.shape[1], prompt_tokens=tokens),
                FinishChunk(task_id=task.task_id, finish_reason="stop", prompt_tokens=tokens, completion_tokens=0)]


def run(body, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    """``body(client, backend)`` against a fresh app on an ``EmbedMaster``, over httpx's ASGI transport."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            backend = EmbedMaster(nursery)
            transport = httpx.ASGITransport(app=create_app(backend))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                with trio.fail_after(timeout):
                    await body(client, backend)
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_openai_float_base64_and_token_inputs() -> None:
    async def body(client, backend) -> None:  # type: ignore[no-untyped-def]
        r = await client.post("/v1/embeddings", json={"model": ENCODER, "input": ["a bb", "ccc"]})
        assert r.status_code == 200, r.text
        out = r.json()
        assert [d["index"] for d in out["data"]] == [0, 1] and out["object"] == "list"
        assert out["data"][0]["embedding"] == [4.0, 101.0, 101 + 1 + 2 + 102, 1.0]
        assert out["usage"] == {"prompt_tokens": 4 + 3, "total_tokens": 7}
        r = await client.post("/v1/embeddings", json={"model": ENCODER, "input": [[5, 6]], "encoding_format": "base64"})
        raw = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
        assert raw.tolist() == [2.0, 5.0, 11.0, 1.0]
        sent = [c.task for c in backend.commands if isinstance(c, SubmitTask)]
        assert sent[-1].params.inputs == ((5, 6),)

    run(body)


def test_rows_in_parts_are_joined_in_order_and_a_width_change_is_a_502() -> None:
    """A runner sends a large answer's rows in several ``EmbeddingChunk`` parts
    (``EMBEDDING_CHUNK_BYTES``): the API joins them in order; parts of different widths are the
    runner's fault, a 502."""
    texts = [" ".join(["w"] * (i + 1)) for i in range(5)]

    def parts(cmd: SubmitTask, widths: tuple[int, ...] = (4, 4, 4)) -> list:
        task = cmd.task
        vecs = _vectors(task.params.inputs)
        out: list = [EmbeddingChunk(task_id=task.task_id, vectors=vecs[i:i + 2, :w].astype("<f4").tobytes(),
                                    count=len(vecs[i:i + 2]), dimensions=w, prompt_tokens=1)
                     for i, w in zip(range(0, len(vecs), 2), widths)]
        return [*out, FinishChunk(task_id=task.task_id, finish_reason="stop", prompt_tokens=1, completion_tokens=0)]

    async def body(client, backend) -> None:  # type: ignore[no-untyped-def]
        backend.script = parts
        r = await client.post("/v1/embeddings", json={"model": ENCODER, "input": texts})
        assert r.status_code == 200, r.text
        assert [d["embedding"][0] for d in r.json()["data"]] == [3.0, 4.0, 5.0, 6.0, 7.0]
        backend.script = lambda cmd: parts(cmd, (4, 3, 4))
        r = await client.post("/v1/embeddings", json={"model": ENCODER, "input": texts})
        assert r.status_code == 502 and "changed width" in r.text

    run(body)


def test_ollama_embed_legacy_and_truncate() -> None:
    async def body(client, backend) -> None:  # type: ignore[no-untyped-def]
        long = " ".join(["w"] * 40)
        r = await client.post("/api/embed", json={"model": ENCODER, "input": ["a", long]})
        assert r.status_code == 200, r.text
        assert r.json()["embeddings"][1][0] == CONTEXT  # cut to the context (Ollama's default)
        assert r.json()["prompt_eval_count"] == 3 + CONTEXT
        r = await client.post("/api/embed", json={"model": ENCODER, "input": long, "truncate": False})
        assert r.status_code == 400 and "context" in r.json()["error"]
        r = await client.post("/api/embeddings", json={"model": ENCODER, "prompt": "a bb"})
        assert r.json() == {"embedding": [4.0, 101.0, 206.0, 1.0]}

    run(body)


def test_rerank_orders_and_cuts() -> None:
    async def body(client, backend) -> None:  # type: ignore[no-untyped-def]
        docs = ["a", "ccc dddd", {"text": "bb"}]
        r = await client.post("/v1/rerank", json={"model": ENCODER, "query": "q", "documents": docs, "top_n": 2})
        assert r.status_code == 200, r.text
        out = r.json()
        assert [x["index"] for x in out["results"]] == [1, 2]
        assert out["results"][1]["document"] == {"text": "bb"} and out["meta"] == {"scoring": "embedding-cosine"}
        r = await client.post("/v1/rerank", json={"model": ENCODER, "query": "q", "documents": ["a"], "return_documents": False})
        assert "document" not in r.json()["results"][0]

    run(body)


@pytest.mark.parametrize(("path", "payload", "status", "shape"), [
    ("/v1/embeddings", {"model": ENCODER, "input": ""}, 400, "openai"),
    ("/v1/embeddings", {"model": ENCODER, "input": ["x"] * (MAX_INPUTS + 1)}, 400, "openai"),
    ("/v1/embeddings", {"model": ENCODER, "input": " ".join(["w"] * 40)}, 400, "openai"),
    ("/v1/embeddings", {"model": ENCODER, "input": [[1000]]}, 400, "openai"),
    ("/v1/embeddings", {"model": "nope", "input": "x"}, 404, "openai"),
    ("/v1/embeddings", {"model": MODEL, "input": "x"}, 400, "openai"),  # its card cannot embed
    ("/api/embed", {"model": ENCODER, "input": [1, 2]}, 400, "ollama"),
    ("/api/embeddings", {"model": ENCODER}, 400, "ollama"),
    ("/v1/rerank", {"model": ENCODER, "query": "q", "documents": []}, 400, "openai"),
])
def test_errors_in_each_family_shape(path: str, payload: dict[str, Any], status: int, shape: str) -> None:
    async def body(client, backend) -> None:  # type: ignore[no-untyped-def]
        r = await client.post(path, json=payload)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert isinstance(err, str) if shape == "ollama" else isinstance(err["message"], str)
        assert not [c for c in backend.commands if isinstance(c, SubmitTask)]  # refused before the cluster

    run(body)


def test_a_command_over_the_log_bound_is_refused(monkeypatch) -> None:
    import exo_p2p.api.bounds as bounds

    monkeypatch.setattr(bounds, "MAX_COMMAND_BYTES", 1000)  # token ids travel into every node's log

    async def body(client, backend) -> None:  # type: ignore[no-untyped-def]
        r = await client.post("/v1/embeddings", json={"model": ENCODER, "input": [[999] * 16] * 64})
        assert r.status_code == 400 and r.json()["error"]["code"] == "request_too_large"
        assert not [c for c in backend.commands if isinstance(c, SubmitTask)]

    run(body)


def test_each_request_is_recorded_with_its_kind() -> None:
    from exo_p2p.metrics.observer import Observer

    records = []

    class Recorder(Observer):
        @property
        def active(self) -> bool:
            return True

        def finished(self, record) -> None:  # type: ignore[no-untyped-def]
            records.append(record)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            app = create_app(EmbedMaster(nursery), observer=Recorder())
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
                await client.post("/v1/embeddings", json={"model": ENCODER, "input": "a bb"})
                await client.post("/v1/rerank", json={"model": ENCODER, "query": "q", "documents": ["a"]})
                await client.post("/api/embed", json={"model": "nope", "input": "a"})
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert [(r.kind, r.family, r.status, r.prompt_tokens) for r in records] == [
        ("embed", "openai", 200, 4), ("rerank", "openai", 200, 3 + 3), ("embed", "ollama", 404, 0)]
