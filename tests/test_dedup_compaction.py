"""De-duplication survives log compaction and failover: the per-origin
sequence numbers are in State (``State.origin_seqs``), so a snapshot carries them under the
State hash, and a master built from snapshot + tail de-duplicates like one built from the
whole log (``master.sequencer``)."""

from __future__ import annotations

import time

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exo_p2p.eventlog import scan_frames
from exo_p2p.replica import Replica
from exo_p2p.state import state_hash
from exo_p2p.types import IndexedEvent, LocalEvent, State, TaskDeleted
from master.role import MasterRole
from master.sequencer import OriginSeqs
from tests.conftest import tiny_models_dir
from tests.support.cluster import NodeProcess, nodes_cleanup, self_id, state_of, wait_until

_NOOP = TaskDeleted("gone")  # applies as a no-op: only the origin fields matter here


@st.composite
def logs(draw: st.DrawFn) -> list[IndexedEvent]:
    """An indexed log as a master writes it: events of a few origins (several boots each,
    numbered 1, 2, 3, … per boot) interleaved with events the master made itself."""
    keys = draw(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from(["b1", "b2", "b2.1"])), min_size=0, max_size=40))
    seqs: dict[tuple[str, str], int] = {}
    events = []
    for idx, key in enumerate(keys, start=1):
        if draw(st.integers(0, 4)) == 0:
            events.append(IndexedEvent(1, idx, _NOOP))
            continue
        seqs[key] = seqs.get(key, 0) + 1
        events.append(IndexedEvent(1, idx, _NOOP, f"node-{key[0]}", key[1], seqs[key]))
    return events


async def _publish(_e: IndexedEvent) -> None:
    return None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=logs(), data=st.data())
def test_any_split_into_snapshot_and_tail_gives_the_same_table(tmp_path_factory, events, data):
    """A replica that compacted after any prefix of the log, reopened from disk (snapshot +
    tail), gives its master the table ``from_log`` builds from the whole log; the snapshot
    also travels as a peer's ``LogResponse`` (msgpack State) without losing it."""
    split = data.draw(st.integers(0, len(events)))
    path = tmp_path_factory.mktemp("log") / "events.log"
    replica = Replica(path, sync=False)
    replica.offer_many(events[:split])
    replica.compact()
    replica.offer_many(events[split:])
    replica.close()
    reopened = Replica(path, sync=False)
    assert [e.idx for e in reopened.log.events] == [e.idx for e in events[split:]]
    whole = OriginSeqs.from_log(events).as_dict()
    master = MasterRole("m", 2, reopened, _publish)
    assert master.origins.as_dict() == whole
    sent = msgspec.msgpack.decode(msgspec.msgpack.encode(reopened.state), type=State)
    assert OriginSeqs.from_state(sent).as_dict() == whole
    # and the master decides every next event alike: accept the next, drop the rest
    for (origin, boot), last in whole.items():
        for seq, verdict in ((last, "duplicate"), (last + 1, "accept"), (last + 2, "gap")):
            assert master.origins.check(LocalEvent(origin, boot, seq, _NOOP)) == verdict  # type: ignore[arg-type]
    reopened.close()


def test_the_table_is_covered_by_the_state_hash():
    one = IndexedEvent(1, 1, _NOOP, "node-a", "b1", 1)
    other = IndexedEvent(1, 1, _NOOP, "node-a", "b1", 2)
    from exo_p2p.state import apply

    assert state_hash(apply(State(), one)) != state_hash(apply(State(), other))
    assert apply(State(), IndexedEvent(1, 1, _NOOP)).origin_seqs == {}


# --- real nodes ---------------------------------------------------------------------------------


def _events_log(node: NodeProcess) -> list[IndexedEvent]:
    return scan_frames((node.data_dir / "events.log").read_bytes())[0]


def _snapshot(node: NodeProcess) -> State | None:
    path = node.data_dir / "snapshot.msgpack"
    return msgspec.msgpack.decode(path.read_bytes(), type=State) if path.exists() else None


MODEL = "tiny"


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tiny_models_dir(tmp_path_factory, n_layers=2, hidden_size=64, seed=11)


@pytest.mark.integration
def test_origin_idle_since_before_a_compaction_is_indexed_after_failover(tmp_path, models_dir):
    """Three nodes compacting every 8 events (``--compact-every``). C joins, then stays
    idle (its memory report is pinned by ``--memory-limit``) while the master A places and
    deletes instances of a model only A holds, until B has compacted C's last event into its
    snapshot (none of C's events is left in B's log). A is killed; B (higher priority) takes
    over from snapshot + tail. C's next event (retracting its edge to the dead A, 2 s after
    the connection closed) must be indexed by B within 15 s of the kill (the 5 s failover
    bound, the 2 s retraction grace, the 1 s re-send, and slack for a loaded machine) — a master that
    rebuilt its table from its log tail alone took it for a gap and dropped it for good."""
    common = ["--compact-every", "8", "--memory-limit", "1GiB"]
    a = NodeProcess(tmp_path / "a", extra_args=[*common, "--priority", "2", "--models-dir", str(models_dir)])
    nodes = [a]
    with nodes_cleanup(nodes):
        a.start()
        boot = [x for addr in a.addrs() for x in ("--bootstrap", addr)]
        b = NodeProcess(tmp_path / "b", cluster=a.cluster, extra_args=[*common, "--priority", "1", *boot])
        c = NodeProcess(tmp_path / "c", cluster=a.cluster, extra_args=[*common, *boot])
        nodes += [b, c]
        b.start()
        c.start()
        ids = {name: self_id(n) for name, n in (("a", a), ("b", b), ("c", c))}

        def settled():
            s = state_of(b)
            return s is not None and len(s["nodes"]) == 3 and all(len(s["edges"].get(i, {})) == 2 for i in ids.values())

        wait_until(settled, 30, what="3 nodes and their edges in State")

        def c_in_tail() -> bool:
            return any(e.origin == ids["c"] for e in _events_log(b))

        for _ in range(8):  # each round indexes ~8 events of A and the master only
            if not c_in_tail() and _snapshot(b) is not None:
                break
            # on A: placement may put a 1-node instance on any node that can fetch the model
            # (docs/models.md) and, among equal nodes, picks the smallest id — C, which would
            # then fetch and run all 8 and never be idle
            view = a.place_and_wait(MODEL, timeout=60, nodes=[ids["a"]])
            assert httpx.delete(a.url + f"/instances/{view['instance_id']}", timeout=30).status_code == 200
            wait_until(lambda: (s := state_of(b)) is not None and not s["instances"], 10, what="instance gone on B")
        snapshot = _snapshot(b)
        assert snapshot is not None and not c_in_tail(), "precondition: C's events are compacted out of B's log"
        assert snapshot.last_event_idx > 0
        def c_last_seq() -> int:
            s = state_of(b)
            return max((s or {}).get("origin_seqs", {}).get(ids["c"], {}).values(), default=0)

        before = c_last_seq()
        a.kill()
        t0 = time.monotonic()
        wait_until(lambda: (s := state_of(b)) is not None and s["master"] == ids["b"], 10, what="B became master")
        # indexed: in B's log tail, or (a compaction since) counted in B's State
        wait_until(lambda: c_in_tail() or c_last_seq() > before, 15 - (time.monotonic() - t0), interval=0.1, what="an event of C indexed by the new master")
        assert time.monotonic() - t0 < 15
