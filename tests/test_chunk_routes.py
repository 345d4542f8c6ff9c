"""Chunk routes between nodes (exo_p2p.chunks.routes): rank 0's node sends each chunk to the
request's API node, numbered; the API node admits chunks only from rank 0 of the task's
instance, and only numbered ones; the task tables stay bounded."""

from __future__ import annotations

from exo_p2p.chunks.router import ChunkRouter
from exo_p2p.chunks.routes import ChunkRoutes, admission, trim_oldest
from exo_p2p.types import ChatMessage, GenerationParams, IndexedEvent, State, TaskCreated, TextGeneration, TokenChunk
from tests.support.rules.strategies import _instance


def test_admission_refuses_a_chunk_not_from_rank0_and_an_unnumbered_one():
    assert admission("rank0", "rank0", numbered=True) == "deliver"
    assert admission(None, "anyone", numbered=True) == "deliver"  # TaskCreated not applied here yet
    assert admission("rank0", "rank0", numbered=False) == "unnumbered"
    assert admission(None, "anyone", numbered=False) == "unnumbered"
    assert admission("rank0", "other", numbered=True) == "refused"
    assert admission("rank0", "other", numbered=False) == "refused"


def test_trim_oldest_forgets_the_oldest_half_beyond_the_limit():
    table = {str(i): "n" for i in range(11)}
    trim_oldest(table, limit=10)
    assert list(table) == [str(i) for i in range(5, 11)]
    small = {"a": "n"}
    trim_oldest(small, limit=10)
    assert small == {"a": "n"}


def _routes(node_id: str) -> tuple[ChunkRoutes, ChunkRouter, list]:
    task = TextGeneration("t1", "i1", "m", GenerationParams((ChatMessage("user", "hi"),)), "api-node")  # type: ignore[arg-type]
    state = State(instances={"i1": _instance("i1", "rank0-node")})  # type: ignore[arg-type]
    router = ChunkRouter()
    routes = ChunkRoutes(node_id, lambda: state, router)
    routes.on_event(IndexedEvent(1, 1, TaskCreated(task)), state)  # type: ignore[arg-type]
    sent: list = []
    routes.bind(lambda destination, chunk, seq: sent.append((destination, chunk.text, seq)), {}, {}, None)  # type: ignore[arg-type]
    return routes, router, sent


def test_rank0_node_sends_numbered_chunks_to_the_api_node():
    routes, _, sent = _routes("rank0-node")
    routes.route(TokenChunk("t1", "a", 1))  # type: ignore[arg-type]
    routes.route(TokenChunk("t1", "b", 2))  # type: ignore[arg-type]
    assert sent == [("api-node", "a", 1), ("api-node", "b", 2)]


def test_api_node_counts_chunks_not_from_rank0_as_refused():
    routes, router, _ = _routes("api-node")
    routes.receive("intruder", [TokenChunk("t1", "x", 1)], [1])  # type: ignore[arg-type]
    routes.receive("rank0-node", [TokenChunk("t1", "y", 1)], [])  # type: ignore[arg-type]
    assert (routes.refused, router.undeliverable) == (1, 2)
