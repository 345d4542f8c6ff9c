"""The event log's hash chain (exo_p2p.state.chain) and the log check that uses it
(``exo_p2p.cluster.log_sync.tail_diverged``): two masters that claimed the same term produce
logs with equal (idx, term) pairs but different events; a follower of one that starts
following the other must see that its tail diverged (found by scripts/chaos.py: a restarted
master, alone for the settle time, claimed the term the others had already used)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p.cluster.log_sync import tail_diverged
from exo_p2p.cluster.messages import LogRequest
from exo_p2p.replica import Replica
from exo_p2p.state.chain import chain_base, chain_step
from exo_p2p.types import IndexedEvent, NodeTimedOut, State
from tests.support.rules.strategies import events, index


def _as_term(evs: list, term: int, start: int = 1) -> list[IndexedEvent]:
    return [IndexedEvent(term=term, idx=start + i, event=e) for i, e in enumerate(evs)]


def _digests(log: list[IndexedEvent]) -> list[bytes]:
    out = [chain_base(State())]
    for e in log:
        out.append(chain_step(out[-1], e))
    return out


@settings(max_examples=50, deadline=None)
@given(st.lists(events, min_size=2, max_size=20), st.data())
def test_chain_digests_are_equal_exactly_on_the_common_prefix(evs, data):
    log = index(evs)
    k = data.draw(st.integers(1, len(log)))
    other = list(log)
    # same idx and term, another event at position k (origin_seq makes it differ surely)
    e = log[k - 1]
    other[k - 1] = IndexedEvent(term=e.term, idx=e.idx, event=e.event, origin="someone-else", origin_seq=e.origin_seq + 1)
    a, b = _digests(log), _digests(other)
    assert a[: k] == b[: k]
    assert all(x != y for x, y in zip(a[k:], b[k:]))




def test_chain_survives_compaction_restart_and_snapshot_install(tmp_path):
    evs = [NodeTimedOut(f"n{i}") for i in range(30)]  # type: ignore[arg-type]
    log = _as_term(evs, 1)
    for d in ("a", "b", "c"):
        (tmp_path / d).mkdir()
    plain = Replica(tmp_path / "a" / "events.log", sync=False)
    plain.offer_many(log)
    compacted = Replica(tmp_path / "b" / "events.log", sync=False, compact_every=7)
    compacted.offer_many(log[:10])
    compacted.offer_many(log[10:])
    assert compacted.base_idx > 0  # it did compact
    assert compacted.chain_at(30) == plain.chain_at(30) == _digests(log)[30]
    assert compacted.chain_at(compacted.base_idx - 1) is None  # before the snapshot: unknown
    compacted.close()
    reopened = Replica(tmp_path / "b" / "events.log", sync=False, compact_every=7)
    assert reopened.chain_at(30) == plain.chain_at(30)
    # a node installing a peer's snapshot takes the peer's digest with it
    fresh = Replica(tmp_path / "c" / "events.log", sync=False)
    fresh.install_snapshot(plain.state, plain.chain_at(30))
    fresh.offer(IndexedEvent(term=1, idx=31, event=NodeTimedOut("x")))  # type: ignore[arg-type]
    plain.offer(IndexedEvent(term=1, idx=31, event=NodeTimedOut("x")))  # type: ignore[arg-type]
    assert fresh.chain_at(31) == plain.chain_at(31)
    # truncation cuts the chain with the log
    plain.truncate_after(20)
    assert plain.chain_at(20) == _digests(log)[20] and plain.chain_at(21) is None


def test_same_term_logs_of_two_masters_are_seen_as_diverged(tmp_path):
    """X and Y both claimed term 3 after a common prefix of 5 events; X's follower holds 8
    events of X; Y's log has 10. By terms alone the follower's tail looks like a prefix of
    Y's log (term 3 at index 8 on both), so Y would append its events 9, 10 to X's
    prefix; with the chain digest Y sees the divergence and answers with a snapshot."""
    for d in ("x", "y"):
        (tmp_path / d).mkdir()
    common = _as_term([NodeTimedOut(f"c{i}") for i in range(5)], 2)  # type: ignore[arg-type]
    x_log = common + _as_term([NodeTimedOut(f"x{i}") for i in range(3)], 3, start=6)  # type: ignore[arg-type]
    y_log = common + _as_term([NodeTimedOut(f"y{i}") for i in range(5)], 3, start=6)  # type: ignore[arg-type]
    follower = Replica(tmp_path / "x" / "events.log", sync=False)
    follower.offer_many(x_log)
    master_y = Replica(tmp_path / "y" / "events.log", sync=False)
    master_y.offer_many(y_log)
    by_terms = LogRequest(from_idx=9, prev_idx=8, prev_term=3)
    assert not tail_diverged(master_y, by_terms)  # the old check is fooled
    with_chain = LogRequest(from_idx=9, prev_idx=8, prev_term=3, prev_chain=follower.chain_at(8))
    assert tail_diverged(master_y, with_chain)
    # a follower that is a true prefix is not diverged
    prefix = LogRequest(from_idx=6, prev_idx=5, prev_term=2, prev_chain=follower.chain_at(5))
    assert not tail_diverged(master_y, prefix)
    # ahead of the responder: diverged (it gets a snapshot)
    assert tail_diverged(master_y, LogRequest(from_idx=12, prev_idx=11, prev_term=3))
