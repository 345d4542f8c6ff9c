"""Late because the peer's host is busy is not gone (``exo_p2p.cluster.liveness``): a heartbeat
carries its sender's own loop lag (``Heartbeat.lag_ms``), and receivers wait that much longer
before they count the sender gone — the master's timeouts too (``cluster.peer_timeouts``).
Together with this node's own stalls the grace is capped at one timeout, so a dead peer is
still gone within two. Pure rules (no process, no socket)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exo_p2p import defaults
from exo_p2p.cluster.heartbeats import lag_ms
from exo_p2p.cluster.liveness import Liveness, Stalls, reported_lag, silence, stalled_between
from exo_p2p.cluster.messages import Heartbeat, encode, heartbeat_decoder
from exo_p2p.cluster.peer_timeouts import timed_out
from tests.support.rules.election_sim import hb

pytestmark = pytest.mark.unit
T = defaults.PEER_TIMEOUT


def lagging(node: str, lag: float, **kw) -> Heartbeat:  # type: ignore[no-untyped-def]
    return msgspec.structs.replace(hb(node, **kw), lag_ms=lag_ms(lag))


def test_a_peer_that_reports_a_4_s_lag_is_given_4_s_more():
    """Heard at 0 from a follower whose loop stalled up to 4 s lately (its host starved):
    live at 8.9 s, gone at 9 s; the same follower reporting no lag is gone at 5 s."""
    live = Liveness(T)
    live.heard(lagging("f", 4.0, term=1, master="m"), 0.0)
    assert [p.node_id for p in live.alive(8.9)] == ["f"] and live.gone(8.9) == []
    assert live.gone(9.0) == ["f"]
    quiet = Liveness(T)
    quiet.heard(hb("f", 1, "m"), 0.0)
    assert quiet.gone(T) == ["f"]


def test_the_master_times_out_a_lagging_node_later_and_a_dead_one_within_two_timeouts():
    args = dict(self_id="m", last_heard=lambda n: 0.0, master_since=-100.0, timeout=T)
    lag = {"x": 3.0, "y": 0.0, "z": 60.0}
    assert timed_out(["x", "y", "z"], now=6.0, **args) == ["x", "y", "z"]  # without the rule
    assert timed_out(["x", "y", "z"], now=6.0, peer_lag=lag.get, **args) == ["y"]
    assert timed_out(["x", "y", "z"], now=8.0, peer_lag=lag.get, **args) == ["x", "y"]
    assert timed_out(["x", "y", "z"], now=2 * T, peer_lag=lag.get, **args) == ["x", "y", "z"]  # capped


@given(st.lists(st.tuples(st.floats(0, 50), st.floats(0, 10)), max_size=20), st.floats(0, 60), st.floats(0, 1e4))
def test_own_stalls_and_a_peers_lag_together_grant_at_most_one_timeout(stalls, now, peer_lag):
    record = [(s, s + d) for s, d in stalls]
    s = silence(0.0, now, T, lambda a, b: stalled_between(record, a, b), peer_lag)
    assert now - T <= s <= now
    if now >= 2 * T:
        assert s >= T  # a dead peer is gone, whatever either side says
    assert s <= silence(0.0, now, T, lambda a, b: stalled_between(record, a, b))  # a lag never shortens


def test_the_heartbeat_reports_the_longest_recent_own_stall_in_ms():
    stalls = Stalls()
    for start, end in ((1.0, 1.2), (10.0, 13.5), (20.0, 20.4)):
        stalls.add(start, end)
    assert stalls.longest_since(0.0) == pytest.approx(3.5)
    assert stalls.longest_since(14.0) == pytest.approx(0.4)  # the 3.5 s one ended before
    assert stalls.longest_since(21.0) == 0.0
    assert lag_ms(3.5) == 3500 and lag_ms(-1.0) == 0
    assert lag_ms(1e9) == defaults.MAX_REPORTED_LAG_MS


def test_an_older_senders_heartbeat_reports_no_lag_and_the_field_round_trips():
    fields = {k: v for k, v in msgspec.structs.asdict(hb("a", 1)).items() if k != "lag_ms"}  # a sender from before
    old = heartbeat_decoder.decode(msgspec.msgpack.encode(fields))
    assert old.lag_ms == 0 and reported_lag(old) == 0.0
    again = heartbeat_decoder.decode(encode(lagging("a", 2.25, term=1)))
    assert again.lag_ms == 2250 and reported_lag(again) == pytest.approx(2.25)
    assert reported_lag(msgspec.structs.replace(again, lag_ms=-5)) == 0.0  # a bad value grants nothing
