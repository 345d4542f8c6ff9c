"""The publish/apply probe (``exo_p2p.cluster.event_times``, ``GET /debug/event-times``) and
the group commit of the replica that keeps publish→apply latency low.

Unit tests: the bounded ring, the group commit of ``Replica.offer_many`` (one fsync per batch,
listeners only after it; a master defers its fsync to ``sync()``), the global-events message
that accepts a batch or a bare event. Integration: 3 real nodes, events made by placing an
instance, chatting and deleting it; every follower applied every index the master published,
not before it was published, within a liveness bound (not the 50 ms target: speed belongs to
``scripts/bench_cluster.py``).
"""

from __future__ import annotations

import os

import httpx
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p.cluster.event_times import EventTimes
from exo_p2p.cluster.messages import IndexedEventBatch, decode_global, encode
from tests.support.models.synthetic_models import make_synthetic_model
from exo_p2p.replica import Replica
from exo_p2p.types import PROTOCOL_VERSION, IndexedEvent, TopologyEdge, TopologyEdgeCreated, TopologyEdgeDeleted
from tests.support.cluster import Cluster, agreement, self_id, state_of, wait_until

MODEL = "tiny"
LIVENESS_S = 5.0
"""Every published event must be applied on every follower within this many seconds."""
CLOCK_SLACK_S = 0.001
"""A follower cannot apply an event before the master published it (one CLOCK_MONOTONIC)."""


# --- the ring ---------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        self.t += 0.5
        return self.t


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(1, 20), indices=st.lists(st.integers(0, 40), max_size=120))
def test_ring_keeps_the_last_capacity_indices_with_their_latest_time(capacity, indices):
    clock = FakeClock()
    probe = EventTimes("n", capacity=capacity, clock=clock)
    expected: dict[int, float] = {}
    for i in indices:
        probe.applied(i)
        expected.pop(i, None)
        expected[i] = clock.t
        while len(expected) > capacity:
            del expected[next(iter(expected))]
    view = probe.since(0)
    assert len(view.applied) <= capacity
    assert view.applied == expected
    assert view.oldest_applied == (min(expected) if expected else None)
    assert view.published == {} and view.received == {}


def test_received_keeps_the_first_time_and_since_filters():
    clock = FakeClock()
    probe = EventTimes("n", capacity=8, clock=clock)
    probe.received(5)
    first = clock.t
    probe.received(5)
    for i in range(1, 8):
        probe.published(i)
    view = probe.since(4)
    assert view.received == {5: first}
    assert sorted(view.published) == [4, 5, 6, 7]
    assert (view.clock, view.unit, view.capacity, view.node_id) == ("CLOCK_MONOTONIC", "s", 8, "n")
    with pytest.raises(ValueError):
        EventTimes("n", capacity=0)


# --- group commit -----------------------------------------------------------------------------


def edge_events(first: int, n: int) -> list[IndexedEvent]:
    out = []
    for idx in range(first, first + n):
        event = TopologyEdgeCreated(TopologyEdge(f"a{idx % 3}", f"b{idx % 5}", "10.0.0.1")) if idx % 2 else TopologyEdgeDeleted(f"a{idx % 3}", f"b{idx % 5}")
        out.append(IndexedEvent(term=1, idx=idx, event=event))  # type: ignore[arg-type]
    return out


@pytest.fixture
def fsyncs(monkeypatch):
    """Counts os.fsync calls (still doing them)."""
    calls = []
    real = os.fsync

    def counting(fd):
        calls.append(fd)
        return real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return calls


def test_offer_many_fsyncs_once_per_batch_before_listeners(tmp_path, fsyncs):
    replica = Replica(tmp_path / "events.log")
    seen: list[tuple[int, int]] = []
    replica.listeners.append(lambda e, s: seen.append((e.idx, len(fsyncs))))
    events = edge_events(1, 10)
    # out of order, with duplicates: 3..10 buffered, then 1 and 2 unblock everything
    outcomes = replica.offer_many(events[2:] + events[2:4])
    assert outcomes == ["buffered"] * 8 + ["buffered"] * 2
    assert fsyncs == [] and seen == []
    outcomes = replica.offer_many(events[:2] + events[:1])
    assert outcomes == ["applied", "applied", "duplicate"]
    assert len(fsyncs) == 1, "one fsync for the whole batch"
    assert [i for i, _ in seen] == list(range(1, 11))
    assert all(n == 1 for _, n in seen), "listeners hear of events only after the fsync"
    replica.close()
    reopened = Replica(tmp_path / "events.log")
    assert reopened.last_idx == 10 and reopened.hash() == replica.hash()
    reopened.close()


def test_deferred_sync_fsyncs_only_on_sync(tmp_path, fsyncs):
    replica = Replica(tmp_path / "events.log")
    replica.defer_sync = True
    for e in edge_events(1, 6):
        assert replica.offer(e) == "applied"
    assert fsyncs == [] and replica.last_idx == 6
    replica.sync()
    replica.sync()  # nothing new: no second fsync
    assert len(fsyncs) == 1
    replica.offer(edge_events(7, 1)[0])
    replica.close()  # close syncs what is pending
    assert len(fsyncs) == 2
    assert Replica(tmp_path / "events.log").last_idx == 7


def test_global_message_is_a_batch_or_a_bare_event():
    events = edge_events(1, 3)
    batch = decode_global(encode(IndexedEventBatch(tuple(events))))
    assert batch.events == tuple(events) and batch.version == PROTOCOL_VERSION
    single = decode_global(encode(events[0]))
    assert single.events == (events[0],)
    old = decode_global(encode(msgspec.structs.replace(events[0], version=99)))
    assert old.version == 99
    with pytest.raises(msgspec.DecodeError):
        decode_global(b"\x93junk")


# --- three real nodes -------------------------------------------------------------------------


def times(node, since: int, until: int | None = None) -> dict:
    """``GET /debug/event-times?since=`` with integer keys, cut at ``until`` (nodes keep
    making events, e.g. profile updates, after the test took its last index)."""
    r = node.get(f"/debug/event-times?since={since}", timeout=10)
    assert r.status_code == 200, r.text
    doc = r.json()
    for kind in ("published", "received", "applied"):
        doc[kind] = {int(k): float(v) for k, v in doc[kind].items() if until is None or int(k) <= until}
    return doc


@pytest.mark.integration
def test_every_follower_applies_every_published_event(tmp_path):
    models = tmp_path / "models"
    make_synthetic_model(models / MODEL, n_layers=2, seed=3)
    cluster = Cluster(tmp_path, 3, extra_args=["--models-dir", str(models)])
    try:
        cluster.start()
        nodes = cluster.nodes
        agreed = wait_until(lambda: agreement(nodes, 3), 60, what="3 nodes agree on master, log and State")
        master_id = agreed[0]
        ids = {self_id(n): n for n in nodes}
        master = ids[master_id]
        followers = [n for i, n in ids.items() if i != master_id]
        first = state_of(master)["last_event_idx"] + 1

        # events: place on a follower, chat through the other follower, delete
        r = followers[1].post("/instances", json={"model": MODEL, "nodes": [self_id(followers[0])]})
        assert r.status_code == 201, r.text
        iid = r.json()["instance_id"]
        wait_until(lambda: master.get(f"/instances/{iid}").json()["status"] == "ready", 120, what="instance ready")
        for i in range(4):
            c = followers[1].chat(f"hello {i}", MODEL, max_tokens=2, temperature=0)
            assert c.status_code == 200, c.text
        assert master.get(f"/instances/{iid}").status_code == 200
        assert httpx.delete(f"{master.url}/instances/{iid}", timeout=30).status_code == 200
        done = wait_until(lambda: agreement(nodes, 3), 30, what="agreement after the events")
        last = done[2]
        assert last - first + 1 >= 10, "the scenario made too few events to test anything"

        m = times(master, first, last)
        fs = [times(f, first, last) for f in followers]
        assert m["node_id"] == master_id and m["clock"] == "CLOCK_MONOTONIC" and m["unit"] == "s"
        assert m["capacity"] >= last - first + 1
        expected = list(range(first, last + 1))
        assert sorted(m["published"]) == expected, "the master published every index it sequenced, once"
        assert sorted(m["applied"]) == expected
        for k in expected:
            assert m["applied"][k] <= m["published"][k], "the master applies (and persists) before publishing"
        assert m["received"] == {}, "the master receives no global events"
        for f, doc in zip(followers, fs):
            assert doc["published"] == {}, "only the master publishes"
            assert sorted(doc["applied"]) == expected, f"{f.url} applied exactly the published indices"
            for k in expected:
                lag = doc["applied"][k] - m["published"][k]
                assert -CLOCK_SLACK_S <= lag <= LIVENESS_S, (k, lag)
            for k, t in doc["received"].items():
                assert k in m["published"] and m["published"][k] - CLOCK_SLACK_S <= t <= doc["applied"][k] + CLOCK_SLACK_S, (k, t)
            assert len(doc["received"]) >= len(expected) // 2, "most events arrive by gossip, not by log fetch"
            # applied times follow index order (events are applied strictly in order)
            ts = [doc["applied"][k] for k in expected]
            assert ts == sorted(ts)

        # since filters; a bad since is a 400, not a crash
        tail = times(followers[0], last, last)
        assert sorted(tail["applied"]) == [last]
        assert all(k >= last for k in times(followers[0], last)["applied"])
        assert followers[0].get("/debug/event-times?since=abc").status_code == 400
    finally:
        cluster.stop()
