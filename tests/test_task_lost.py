"""A request whose task vanished from State ends (exo_p2p.chunks.router ``task_lost``, ``sweep``).

Found by scripts/chaos.py: a moved request's continuation was accepted by a master
whose divergent log tail was dropped when the cluster followed the other side's master; the
task was in no State any more, no runner ran it, no event said so, and the client's stream
got keep-alives for 125 s (two "hung" requests). Without the sweep such a request waits for
the API's 600 s chunk timeout.
"""

from __future__ import annotations

import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from exo_p2p.chunks.router import LOST_GRACE, UNSEEN_BOUND, ChunkRouter, task_lost
from exo_p2p.types import ChatMessage, GenerationParams, State, TaskRecord, TextGeneration, TokenChunk

times = st.floats(min_value=0, max_value=1000, allow_nan=False)


@given(opened=times, seen=st.none() | times, chunk=st.none() | times, later=times)
def test_a_stream_whose_chunks_keep_coming_is_never_lost(opened, seen, chunk, later):
    now = max(opened, seen or 0, chunk or 0) + later
    recent = now - LOST_GRACE / 2
    assert not task_lost(opened_at=opened, last_seen=seen, last_chunk=recent, now=now)


@given(opened=times, seen=times, later=st.floats(min_value=0, max_value=100, allow_nan=False))
def test_a_seen_task_is_lost_exactly_when_missing_for_the_grace(opened, seen, later):
    now = seen + later
    assert task_lost(opened_at=opened, last_seen=seen, last_chunk=None, now=now) == (later >= LOST_GRACE)


@given(opened=times, later=st.floats(min_value=0, max_value=100, allow_nan=False))
def test_a_never_seen_task_is_lost_after_the_unseen_bound(opened, later):
    assert task_lost(opened_at=opened, last_seen=None, last_chunk=None, now=opened + later) == (later >= UNSEEN_BOUND)


def _state_with(task_id: str | None) -> State:
    if task_id is None:
        return State()
    task = TextGeneration(task_id, "i1", "m", GenerationParams((ChatMessage("user", "hi"),)), "node-b")  # type: ignore[arg-type]
    return State(tasks={task_id: TaskRecord(task, "running")})  # type: ignore[arg-type]


def test_a_task_dropped_from_state_without_an_event_ends_its_request_with_a_movable_503():
    """The sweep ends it about ``LOST_GRACE`` after the task was last in State; the request
    whose task is still there, and one whose chunks keep coming, go on."""
    clock = trio.testing.MockClock(autojump_threshold=0)

    async def body():
        router = ChunkRouter()
        current = {"state": State(tasks={**_state_with("gone").tasks, **_state_with("kept").tasks})}
        async with trio.open_nursery() as nursery:
            router.bind(nursery)
            gone, kept, streaming = router.open("gone"), router.open("kept"), router.open("streaming")
            nursery.start_soon(router.watch, lambda: current["state"])
            await trio.sleep(3)
            t_replaced = trio.current_time()
            current["state"] = _state_with("kept")  # the log was replaced: "gone" is in no State

            async def feed():
                for i in range(40):
                    router.deliver(TokenChunk(task_id="streaming", text="x", completion_tokens=i + 1, token_id=i))  # type: ignore[arg-type]
                    await trio.sleep(1)

            nursery.start_soon(feed)
            with trio.fail_after(LOST_GRACE + 3):
                chunk = await gone.receive()
            waited = trio.current_time() - t_replaced
            assert chunk.error.status == 503 and chunk.error.code == "generation_failed", chunk
            assert "no longer in the cluster's State" in chunk.error.message
            assert LOST_GRACE - 1 <= waited <= LOST_GRACE + 2, waited
            await trio.sleep(20)
            assert kept.statistics().current_buffer_used == 0  # nothing, in particular no error
            seen = []
            while True:
                try:
                    seen.append(streaming.receive_nowait())
                except trio.WouldBlock:
                    break
            assert seen and all(isinstance(c, TokenChunk) for c in seen)
            assert router.lost == 1
            nursery.cancel_scope.cancel()

    trio.run(body, clock=clock)


def test_a_request_whose_task_never_appears_ends_after_the_unseen_bound():
    clock = trio.testing.MockClock(autojump_threshold=0)

    async def body():
        router = ChunkRouter()
        async with trio.open_nursery() as nursery:
            router.bind(nursery)
            receive = router.open("never")
            t0 = trio.current_time()
            nursery.start_soon(router.watch, lambda: State())
            with trio.fail_after(UNSEEN_BOUND + 3):
                chunk = await receive.receive()
            assert chunk.error.status == 503 and UNSEEN_BOUND <= trio.current_time() - t0 <= UNSEEN_BOUND + 2
            nursery.cancel_scope.cancel()

    trio.run(body, clock=clock)
