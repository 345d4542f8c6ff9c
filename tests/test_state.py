"""apply: purity, determinism, replay from the on-disk log, out-of-order delivery."""

from __future__ import annotations


import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p.eventlog import EventLog
from exo_p2p.replica import Replica
from exo_p2p.state import EventOrderError, apply, canonical_bytes, state_hash
from exo_p2p.types import IndexedEvent, State
from tests.support.rules.strategies import events, index


def replay(evs: list[IndexedEvent]) -> State:
    state = State()
    for e in evs:
        state = apply(state, e)
    return state


@given(st.lists(events, max_size=40))
def test_apply_is_deterministic_and_pure(evs):
    indexed = index(evs)
    before = [canonical_bytes(State())]
    s1 = replay(indexed)
    s2 = replay(indexed)
    assert state_hash(s1) == state_hash(s2)
    assert s1.last_event_idx == len(evs)
    # applying never mutates its input
    state = State()
    for e in indexed:
        snapshot = canonical_bytes(state)
        state2 = apply(state, e)
        assert canonical_bytes(state) == snapshot
        state = state2
    assert before[0] == canonical_bytes(State())


@settings(max_examples=60, deadline=None)
@given(st.lists(events, max_size=30))
def test_replay_from_disk_log_gives_same_state(tmp_path_factory, evs):
    path = tmp_path_factory.mktemp("log") / "events.log"
    indexed = index(evs)
    replica = Replica(path, sync=False)
    for e in indexed:
        assert replica.offer(e) == "applied"
    expected = state_hash(replica.state)
    replica.close()
    reopened = Replica(path)
    assert state_hash(reopened.state) == expected
    assert reopened.state.last_event_idx == len(evs)
    reopened.close()


@settings(max_examples=80, deadline=None)
@given(st.lists(events, min_size=1, max_size=25), st.randoms(use_true_random=False), st.integers(0, 10))
def test_duplicates_and_reordering_through_the_buffer_give_in_order_state(tmp_path_factory, evs, rnd, dups):
    indexed = index(evs)
    deliveries = list(indexed) + [rnd.choice(indexed) for _ in range(dups)]
    rnd.shuffle(deliveries)
    replica = Replica(tmp_path_factory.mktemp("r") / "events.log", sync=False)
    for e in deliveries:
        replica.offer(e)
    assert replica.state == replay(indexed)
    assert state_hash(replica.state) == state_hash(replay(indexed))
    replica.close()


def test_out_of_order_apply_raises():
    with pytest.raises(EventOrderError):
        apply(State(), IndexedEvent(term=1, idx=2, event=index([])[0].event if False else _any_event()))


def _any_event():
    from exo_p2p.types import MasterElected

    return MasterElected("node-a", 1)


def test_torn_last_frame_is_truncated(tmp_path):
    path = tmp_path / "events.log"
    log = EventLog(path)
    evs = index([_any_event() for _ in range(5)])
    for e in evs:
        log.append(e)
    log.close()
    data = path.read_bytes()
    # simulate a crash mid-write of a sixth frame: a header and part of a payload
    from exo_p2p.eventlog import encode_frame

    sixth = encode_frame(IndexedEvent(term=1, idx=6, event=_any_event()))
    for cut in (1, 5, len(sixth) - 1):
        path.write_bytes(data + sixth[:cut])
        reopened = EventLog(path)
        assert [e.idx for e in reopened.events] == [1, 2, 3, 4, 5]
        reopened.close()
        assert path.read_bytes() == data
    # a flipped byte in the last frame's payload fails its checksum
    corrupted = bytearray(data)
    corrupted[-2] ^= 0xFF
    path.write_bytes(bytes(corrupted))
    reopened = EventLog(path)
    assert [e.idx for e in reopened.events] == [1, 2, 3, 4]
    reopened.append(IndexedEvent(term=1, idx=5, event=_any_event()))
    reopened.close()
    assert [e.idx for e in EventLog(path).events] == [1, 2, 3, 4, 5]


def test_state_hash_ignores_dict_insertion_order():
    from exo_p2p.types import NodeProfile, NodeProfileUpdated

    a = NodeProfileUpdated(NodeProfile("node-a", "b", "a"))
    b = NodeProfileUpdated(NodeProfile("node-b", "b", "b"))
    s1 = replay(index([a, b]))
    s2 = replay(index([b, a]))
    assert s1.nodes.keys() == s2.nodes.keys()
    assert list(s1.nodes) != list(s2.nodes)
    assert state_hash(s1) == state_hash(s2)


def test_state_roundtrips_through_msgpack():
    from tests.support.rules.strategies import CARD
    from exo_p2p.types import NodeModelsUpdated

    s = replay(index([NodeModelsUpdated("node-a", (CARD,))]))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(s), type=State) == s
