"""A busy host is not a gone peer (``exo_p2p.cluster.liveness``, "Late because this host is
busy is not gone"): this node's own loop stalls do not count as a peer's silence, up to one
timeout; and ``exo_p2p.node.loop_watch`` records those stalls, the one going on included. Pure
rules, plus the watch on a real trio loop (no process, no socket)."""

from __future__ import annotations

import time

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from exo_p2p import defaults
from exo_p2p.cluster.liveness import Liveness, Stalls, gone_silent, silence, stalled_between
from exo_p2p.cluster.peer_timeouts import timed_out
from exo_p2p.node.loop_watch import LoopWatch
from tests.support.rules.election_sim import hb

pytestmark = pytest.mark.unit
T = 5.0


def test_the_field_case_a_35_s_lag_does_not_lose_the_master():
    """Heard the master at 0; this node's loop stalled from 1.5 to 5.0 s (3.5 s, a heavy hub
    read); at 5.2 the election runs before the queued heartbeats are read: the master is
    still live (1.7 s of silence), and gone only at 8.5 s if really silent."""
    stalls = Stalls()
    stalls.add(1.5, 5.0)
    live = Liveness(T, stalls.between)
    live.heard(hb("m", 3, "m"), 0.0)
    assert [p.node_id for p in live.alive(5.2)] == ["m"]
    assert live.gone(8.49) == [] and live.gone(8.5) == ["m"]
    assert [p.node_id for p in Liveness(T).alive(5.2)] == []  # without the rule: gone


def test_the_ongoing_stall_counts_before_the_watch_wakes():
    stalls = Stalls()
    stalls.due = 1.0  # the watch should have run at 1.0 and has not yet
    assert stalls.between(0.0, 4.0) == pytest.approx(3.0)
    assert stalls.between(0.0, 0.5) == 0.0


@given(st.lists(st.tuples(st.floats(0, 50), st.floats(0, 10)), max_size=20), st.floats(0, 60))
def test_a_silent_peer_is_gone_within_two_timeouts_however_busy_this_host(stalls, now):
    record = [(s, s + d) for s, d in stalls]
    credit = stalled_between(record, 0.0, now)
    assert 0.0 <= credit
    s = silence(0.0, now, T, lambda a, b: stalled_between(record, a, b))
    assert now - T <= s <= now  # never more than one timeout of credit
    if now >= 2 * T:
        assert s >= T  # gone


def test_a_node_woken_from_a_stop_past_the_timeout_listens_before_it_judges():
    """A follower SIGSTOPped 10.2 s (its master heard at 0, the stop from 0.5): on waking it
    keeps the master until its loop has run ``LISTEN_AFTER_STALL`` — the master's queued
    heartbeats are read by then; a master that really died is gone then, not 10 s later."""
    stalls = Stalls()
    stalls.add(0.5, 10.7)
    live = Liveness(T, stalls.between)
    live.heard(hb("m", 3, "m"), 0.0)
    woke = 10.7 + defaults.LISTEN_AFTER_STALL - 0.5  # it had run 0.5 s before the stop
    assert [p.node_id for p in live.alive(10.8)] == ["m"] and live.gone(woke - 0.01) == []
    assert live.gone(woke + 0.01) == ["m"]
    assert silence(0.0, 10.8, T, stalls.between) >= T  # the cap alone judged it gone at once


@given(st.lists(st.tuples(st.floats(0, 50), st.floats(0, 10)), max_size=20), st.floats(0, 60))
def test_a_peer_is_gone_once_silent_two_timeouts_and_this_node_ran_long_enough(stalls, now):
    record = [(s, s + d) for s, d in stalls]
    stalled = lambda a, b: stalled_between(record, a, b)  # noqa: E731
    ran = now - stalled(0.0, now)
    gone = gone_silent(0.0, now, T, stalled)
    if now >= 2 * T and ran >= defaults.LISTEN_AFTER_STALL:
        assert gone
    if ran < defaults.LISTEN_AFTER_STALL or now < T:
        assert not gone


def test_master_times_a_node_out_only_for_its_own_silence():
    stalls = Stalls()
    stalls.add(2.0, 5.0)
    args = dict(self_id="m", last_heard=lambda n: 1.0, master_since=-100.0, timeout=T)
    assert timed_out(["m", "x"], now=6.5, **args) == ["x"]
    assert timed_out(["m", "x"], now=6.5, stalled=stalls.between, **args) == []
    assert timed_out(["m", "x"], now=9.0, stalled=stalls.between, **args) == ["x"]


def test_the_loop_watch_records_a_blocking_step_as_a_stall():
    watch = LoopWatch(interval=0.01, slow_step=0.1, warn=0.2)
    seen = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch.run)
            await trio.sleep(0.05)
            t0 = time.monotonic()
            time.sleep(0.3)  # a step that holds the loop
            seen["during"] = watch.stalls.between(t0, time.monotonic())  # before the watch ran again
            await trio.sleep(0.05)
            seen["after"] = watch.stalls.between(t0, time.monotonic())
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert 0.25 <= seen["during"] <= 0.35 + 0.2
    assert 0.25 <= seen["after"] <= 0.35 + 0.2


# --- the master confirms before it times a connected node out ---------------------------------------


def _timeout_pass(answers: bool, connected: bool) -> tuple[list, int]:
    """One node "x" last heard at 0; the master (since -100) checks at 6 s. Returns the
    events emitted and how many direct heartbeats were sent."""
    from types import SimpleNamespace

    from exo_p2p.cluster.common import Counters, Role
    from exo_p2p.cluster.sequencing import MasterLink
    from exo_p2p.cluster.settings import ClusterSettings

    emitted: list = []
    asked: list[str] = []

    async def exchange(peer: str):  # type: ignore[no-untyped-def]
        asked.append(peer)
        return object() if answers else None

    async def emit(events) -> int:  # type: ignore[no-untyped-def]
        emitted.extend(events)
        return 0

    role = Role("m")
    role.is_master = True
    peers = SimpleNamespace(liveness=SimpleNamespace(last_heard=lambda n: 0.0, get=lambda n: None), disconnected_at={}, started_at=-100.0,
                            direct=SimpleNamespace(exchange=exchange))
    net = SimpleNamespace(connected_peers=lambda: {"x"} if connected else set())
    link = MasterLink(net, SimpleNamespace(state=SimpleNamespace(nodes={"m": 1, "x": 1})), role, peers,
                      SimpleNamespace(emit=emit), ClusterSettings(), Counters(), None,
                      master_since=lambda: -100.0, clock=lambda: 6.0)

    async def main() -> None:
        with trio.move_on_after(1.5):
            await link.timeout_loop()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return emitted, len(asked)


def test_a_late_node_that_answers_a_direct_heartbeat_is_not_timed_out():
    emitted, asked = _timeout_pass(answers=True, connected=True)
    assert emitted == [] and asked >= 1
    emitted, _ = _timeout_pass(answers=False, connected=True)  # stopped (SIGSTOP): no answer
    assert [type(e).__name__ for e in emitted][:1] == ["NodeTimedOut"]
    emitted, asked = _timeout_pass(answers=True, connected=False)  # no connection: not asked
    assert asked == 0 and emitted
