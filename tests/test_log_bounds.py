"""Bulky events cannot make the log unbounded: a log response carries at most
``LOG_SERVE_MAX_BYTES`` of events (a follower catches up in several requests), and a log is
compacted at ``LOG_COMPACT_BYTES`` as well as at ``LOG_COMPACT_EVENTS``
(docs/architecture.md#log-guarantees, ``exo_p2p.replica``, ``exo_p2p.cluster.log_sync``)."""

from __future__ import annotations

from pathlib import Path

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p import defaults
from exo_p2p.cluster.common import Counters, Role
from exo_p2p.cluster.log_sync import LogFollower, log_answer
from exo_p2p.cluster.messages import LogRequest, encode, log_request_decoder
from exo_p2p.cluster.settings import ClusterSettings
from exo_p2p.eventlog import encode_frame
from exo_p2p.gap_buffer import MAX_BUFFERED_BYTES, GapBuffer
from exo_p2p.replica import Replica, compaction_due
from exo_p2p.types import ChatMessage, GenerationParams, IndexedEvent, TaskCreated, TaskDeleted, TextGeneration

EVENT_BYTES = 130 * 1024
"""About the largest event a request makes: its command is at most 128 KiB
(``exo_p2p.api.bounds.MAX_COMMAND_BYTES``) and its ``TaskCreated`` a few hundred bytes more."""


def bulky(idx: int, size: int = EVENT_BYTES) -> IndexedEvent:
    """A ``TaskCreated`` of about ``size`` bytes at index ``idx``, term 1."""
    params = GenerationParams(messages=(ChatMessage("user", "x" * size),), stop=tuple(f"{i:03d}" + "s" * 253 for i in range(16)))
    task = TextGeneration(task_id=f"t{idx}", instance_id="i", model_id="m", params=params, api_node_id="a")
    return IndexedEvent(1, idx, TaskCreated(task))


def test_a_log_response_is_bounded_in_bytes_and_a_follower_catches_up_in_several(tmp_path: Path):
    """100 events of ~134 KiB (13 MiB, which 5,000 of them would make 650 MiB, ten times
    the request frame): each answer carries at most ``LOG_SERVE_MAX_BYTES`` of them, and a
    follower asking from 1 gets them all, in order, over several requests."""
    master = Replica(tmp_path / "m" / "events.log", sync=False)
    master.offer_many([bulky(i) for i in range(1, 101)])
    assert master.log.bytes > 3 * defaults.LOG_SERVE_MAX_BYTES
    answer = log_answer(master, LogRequest(from_idx=1))
    assert answer.snapshot is None and answer.events
    sent = sum(len(encode_frame(e)) for e in answer.events)
    assert sent <= defaults.LOG_SERVE_MAX_BYTES < sent + len(encode_frame(bulky(1)))
    assert len(encode(answer)) < defaults.LOG_SERVE_MAX_BYTES + 64 * 1024

    class Net:
        sizes: list[int] = []

        async def request(self, peer: str, protocol: str, data: bytes, *, timeout: float) -> bytes:
            reply = encode(log_answer(master, log_request_decoder.decode(data)))
            self.sizes.append(len(reply))
            return reply

    class Peers:
        liveness: dict = {}

    follower = Replica(tmp_path / "f" / "events.log", sync=False)
    net = Net()
    member = LogFollower(net, follower, Role("f", master="m", term=1), Peers(), ClusterSettings(), Counters(), None)  # type: ignore[arg-type]
    assert trio.run(member.fetch_from, "m")
    assert follower.last_idx == 100 and follower.hash() == master.hash()
    assert len(net.sizes) >= 4 and max(net.sizes) < defaults.LOG_SERVE_MAX_BYTES + 64 * 1024, net.sizes


def test_one_event_larger_than_the_byte_bound_is_still_served_alone(tmp_path: Path):
    replica = Replica(tmp_path / "events.log", sync=False, compact_bytes=1 << 40)
    replica.offer_many([bulky(1, defaults.LOG_SERVE_MAX_BYTES + 1), bulky(2, 10)])
    assert [e.idx for e in log_answer(replica, LogRequest(from_idx=1)).events] == [1]
    assert [e.idx for e in log_answer(replica, LogRequest(from_idx=2)).events] == [2]


@settings(max_examples=50, deadline=None)
@given(sizes=st.lists(st.integers(1, 400), min_size=0, max_size=30), from_idx=st.integers(1, 32),
       max_events=st.integers(-1, 40), max_bytes=st.integers(0, 4000))
def test_events_from_takes_a_prefix_within_both_bounds(tmp_path_factory, sizes, from_idx, max_events, max_bytes):
    replica = Replica(tmp_path_factory.mktemp("log") / "events.log", sync=False, compact_bytes=1 << 40)
    replica.offer_many([IndexedEvent(1, i, TaskDeleted("x" * n)) for i, n in enumerate(sizes, start=1)])
    got = replica.events_from(from_idx, max_events, max_bytes)
    assert got is not None
    want = list(replica.log.events[from_idx - 1 :][: max(max_events, 0)])
    assert got == want[: len(got)]  # a prefix, in order
    frames = [len(encode_frame(e)) for e in got]
    assert len(got) <= 1 or sum(frames) <= max_bytes
    if len(got) < len(want):  # cut by bytes: the next one would not fit
        assert sum(frames) + len(encode_frame(want[len(got)])) > max_bytes


def test_the_log_is_compacted_by_bytes_before_its_count(tmp_path: Path):
    """A node's ``events.log`` never grows past ``LOG_COMPACT_BYTES`` plus one group commit,
    however few events: 200 tasks of ~134 KiB created and ended (26 MiB in 400 events, far
    below 20,000); the snapshot holds State, where ended tasks are gone."""
    path = tmp_path / "events.log"
    replica = Replica(path, sync=False)
    largest = 0
    for k in range(200):
        replica.offer_many([bulky(2 * k + 1), IndexedEvent(1, 2 * k + 2, TaskDeleted(f"t{2 * k + 1}"))])
        largest = max(largest, path.stat().st_size)
        assert replica.log.bytes == path.stat().st_size
    assert largest < defaults.LOG_COMPACT_BYTES
    assert replica.base_idx > 0 and replica.last_idx == 400
    assert path.with_name("snapshot.msgpack").stat().st_size < 64 * 1024
    replica.close()
    again = Replica(path, sync=False)  # snapshot + tail read back as the same State
    assert again.last_idx == 400 and again.hash() == replica.hash()


@given(events=st.integers(0, 50_000), size=st.integers(0, 1 << 30))
def test_compaction_due_at_either_bound(events, size):
    due = compaction_due(events, size, compact_every=defaults.LOG_COMPACT_EVENTS, compact_bytes=defaults.LOG_COMPACT_BYTES)
    assert due == (events >= defaults.LOG_COMPACT_EVENTS or size >= defaults.LOG_COMPACT_BYTES)


def test_events_ahead_of_a_gap_are_buffered_up_to_a_byte_bound_then_fetched_again(tmp_path: Path):
    """A follower missing event 1 while gossip brings 2, 3, … of ~134 KiB each buffers them up
    to ``MAX_BUFFERED_BYTES`` (32 MiB, ~250 of them; a count of 100,000 alone would let it take
    13 GB) and refuses the rest; once 1 arrives it applies what it held, and the refused ones
    come again (a fetch) and apply."""
    replica = Replica(tmp_path / "events.log", sync=False)
    event = bulky(2)
    outcomes = replica.offer_many([bulky(i) for i in range(2, 302)])
    held = outcomes.count("buffered")
    assert 0 < held < 300 and outcomes[held:] == ["dropped"] * (300 - held)
    assert held * len(encode(event)) <= MAX_BUFFERED_BYTES < (held + 1) * len(encode(event)) + 1024
    assert replica.missing_range() == (1, 1)
    replica.offer_many([bulky(1)])
    assert replica.last_idx == held + 1 and replica.missing_range() is None
    replica.offer_many([bulky(i) for i in range(held + 2, 302)])
    assert replica.last_idx == 301


@given(ops=st.lists(st.tuples(st.sampled_from(["add", "pop", "drop"]), st.integers(1, 40), st.integers(0, 300)), max_size=60))
def test_the_gap_buffer_counts_its_bytes_exactly(ops):
    buffer = GapBuffer(max_events=20, max_bytes=3000)
    for op, idx, n in ops:
        if op == "add":
            buffer.add(IndexedEvent(1, idx, TaskDeleted("x" * n)))
        elif op == "pop":
            buffer.pop(idx)
        else:
            buffer.drop_through(idx)
        assert buffer.bytes == sum(len(encode(e)) for e, _ in buffer._events.values()) <= 3000
        assert len(buffer) <= 20
