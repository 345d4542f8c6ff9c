"""The chunk router ends every request (exo_p2p.chunks.router): a task failed by its runner
ends with the runner's own error chunk when it arrives after the "failed" event (found by an
adversarial tester: a 400 for a prompt longer than the context became a vague 503 on an API
node that does not host rank 0); a task whose instance failed ends at once with the reason;
one with no chunk at all ends after the grace."""

from __future__ import annotations

import trio

from exo_p2p.chunks.router import ChunkRouter
from exo_p2p.types import (
    ChatMessage,
    ErrorChunk,
    ErrorInfo,
    GenerationParams,
    IndexedEvent,
    State,
    TaskRecord,
    TaskStatusUpdated,
    TextGeneration,
)
from tests.support.rules.strategies import _instance


def _state(instance_failed: bool) -> State:
    inst = _instance("i1", "node-a")
    if instance_failed:
        import msgspec

        inst = msgspec.structs.replace(inst, failed_reason="node node-a is gone")
    task = TextGeneration("t1", "i1", "m", GenerationParams((ChatMessage("user", "hi"),)), "node-b")  # type: ignore[arg-type]
    return State(instances={"i1": inst}, tasks={"t1": TaskRecord(task, "failed")})  # type: ignore[arg-type]


def _run(instance_failed: bool, late_chunk: ErrorChunk | None, chunk_after: float) -> tuple[ErrorChunk, float]:
    async def body() -> tuple[ErrorChunk, float]:
        router = ChunkRouter(grace=5.0, failed_grace=1.0)
        async with trio.open_nursery() as nursery:
            router.bind(nursery)
            receive = router.open("t1")
            t0 = trio.current_time()
            router.on_event(IndexedEvent(1, 1, TaskStatusUpdated("t1", "failed")), _state(instance_failed))  # type: ignore[arg-type]
            if late_chunk is not None:
                await trio.sleep(chunk_after)
                router.deliver(late_chunk)
            with trio.fail_after(5):
                chunk = await receive.receive()
            nursery.cancel_scope.cancel()
            return chunk, trio.current_time() - t0  # type: ignore[return-value]

    return trio.run(body)


CONTEXT_400 = ErrorChunk(task_id="t1", error=ErrorInfo(400, "prompt is 3018 tokens but the model's context is 2048 tokens", "invalid_request_error", code="context_length_exceeded"))  # type: ignore[arg-type]


def test_runner_error_chunk_arriving_after_the_failed_event_is_what_the_client_gets():
    chunk, _ = _run(instance_failed=False, late_chunk=CONTEXT_400, chunk_after=0.3)
    assert chunk.error.status == 400 and chunk.error.code == "context_length_exceeded"


def test_failed_instance_ends_the_request_at_once_with_the_reason():
    chunk, took = _run(instance_failed=True, late_chunk=None, chunk_after=0.0)
    assert chunk.error.status == 503 and "node node-a is gone" in chunk.error.message
    assert took < 0.5


def test_failed_task_without_any_chunk_ends_after_the_grace():
    chunk, took = _run(instance_failed=False, late_chunk=None, chunk_after=0.0)
    assert chunk.error.status == 503 and "without a result" in chunk.error.message
    assert 0.9 <= took < 3.0
