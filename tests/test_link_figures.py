"""Link figures (docs/links.md): quantising, when a figure is worth an event, State's links
(bounded, dropped with their edge or node), and the prober's pure rules."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from exo_p2p.links.figures import (
    BANDWIDTH_EVERY,
    RTT_FLOOR_US,
    bandwidth_due,
    median_rtt_us,
    moved,
    quantise,
    throughput,
)
from exo_p2p.links.measure import Inconclusive, Unreachable
from exo_p2p.links.prober import LOSE_AFTER, PeerMemory, probe_targets, round_events
from exo_p2p.state.apply import apply
from exo_p2p.types import (
    IndexedEvent,
    LinkFigures,
    LinkLost,
    LinkMeasured,
    NetworkAddress,
    NodeProfile,
    NodeTimedOut,
    State,
    TopologyEdge,
    TopologyEdgeCreated,
    TopologyEdgeDeleted,
)
from exo_p2p.types.topology import MAX_ADDRESSES


def test_quantise_keeps_two_significant_digits() -> None:
    assert [quantise(v) for v in (0, 0.4, 7, 99.4, 1234, 1250.1, 987_654)] == [0, 1, 7, 99, 1200, 1300, 990_000]
    assert median_rtt_us([0.001, 0.0004, 0.0035]) == 1000
    assert throughput(1 << 20, 0.5) == 2_100_000


@given(st.floats(0.001, 1e12))
def test_quantise_is_within_five_percent(value: float) -> None:
    assert abs(quantise(value) - value) <= 0.05 * value + 1


def test_moved_needs_a_fraction_and_a_floor() -> None:
    old = LinkFigures("10.0.0.2", 400, 100_000_000)
    assert not moved(old, LinkFigures("10.0.0.2", 800, 100_000_000))  # +100 % but under the floor
    assert not moved(old, LinkFigures("10.0.0.2", 400 + RTT_FLOOR_US, 100_000_000))  # floor not exceeded
    assert moved(old, LinkFigures("10.0.0.2", 20_000, 100_000_000))  # a shaped link's delay
    assert not moved(old, LinkFigures("10.0.0.2", 400, 125_000_000))  # bandwidth +25 %
    assert moved(old, LinkFigures("10.0.0.2", 400, 12_000_000))  # bandwidth ÷ 8
    assert not moved(old, LinkFigures("10.0.0.2", 400, None))  # not measured this round: no news
    assert moved(None, LinkFigures("10.0.0.2", 400))
    assert moved(LinkFigures("10.0.0.2", 400), LinkFigures("10.0.0.2", 400, 5))


@given(st.integers(1, 10**6), st.integers(10**3, 10**10), st.floats(0.8, 1.2), st.floats(0.8, 1.2))
def test_noise_of_twenty_percent_is_never_news(rtt: int, bw: int, f_rtt: float, f_bw: float) -> None:
    old = LinkFigures("a", rtt, bw)
    assert not moved(old, LinkFigures("a", int(rtt * f_rtt), int(bw * f_bw)))


def test_bandwidth_is_due_first_after_an_rtt_move_and_rarely_else() -> None:
    assert bandwidth_due(last_rtt_us=None, rtt_us=300, measured_at=None, now=0)
    assert not bandwidth_due(last_rtt_us=300, rtt_us=350, measured_at=0.0, now=BANDWIDTH_EVERY - 1)
    assert bandwidth_due(last_rtt_us=300, rtt_us=350, measured_at=0.0, now=BANDWIDTH_EVERY)
    assert bandwidth_due(last_rtt_us=300, rtt_us=30_000, measured_at=0.0, now=1)


def _state(addrs_b: tuple[str, ...] = ("10.0.1.2", "10.0.2.2"), edge: str = "10.0.1.2") -> State:
    def prof(n: str, addrs: tuple[str, ...]) -> NodeProfile:
        return NodeProfile(n, "boot", n, addrs=tuple(NetworkAddress(f"/ip4/{a}/tcp/1", a) for a in addrs))  # type: ignore[arg-type]

    return State(nodes={"a": prof("a", ("10.0.1.1",)), "b": prof("b", addrs_b)},  # type: ignore[dict-item]
                 edges={"a": {"b": TopologyEdge("a", "b", edge)}})  # type: ignore[dict-item,arg-type]


def _run(state: State, *events) -> State:  # type: ignore[no-untyped-def]
    for ev in events:
        state = apply(state, IndexedEvent(1, state.last_event_idx + 1, ev))
    return state


def test_state_keeps_one_figure_per_address_and_drops_them_with_the_edge_or_node() -> None:
    s = _run(_state(), LinkMeasured("a", "b", LinkFigures("10.0.1.2", 300, 10**8)),
             LinkMeasured("a", "b", LinkFigures("10.0.2.2", 20_000, 10**6)))
    assert set(s.links["a"]["b"]) == {"10.0.1.2", "10.0.2.2"}
    s2 = _run(s, LinkLost("a", "b", "10.0.2.2"))
    assert set(s2.links["a"]["b"]) == {"10.0.1.2"}
    assert _run(s2, LinkLost("a", "b", "10.0.1.2")).links == {}
    assert _run(s, TopologyEdgeDeleted("a", "b")).links == {}  # type: ignore[arg-type]
    assert _run(s, NodeTimedOut("b")).links == {}  # type: ignore[arg-type]
    assert _run(_state(), LinkMeasured("a", "zz", LinkFigures("10.0.1.2", 1))).links == {}  # unknown sink
    assert _run(_state(), LinkMeasured("a", "a", LinkFigures("10.0.1.2", 1))).links == {}  # self


def test_state_holds_at_most_max_addresses_per_pair() -> None:
    s = _run(_state(), *(LinkMeasured("a", "b", LinkFigures(f"10.9.0.{i}", 100 + i)) for i in range(MAX_ADDRESSES + 3)))
    assert len(s.links["a"]["b"]) == MAX_ADDRESSES
    s = _run(s, LinkMeasured("a", "b", LinkFigures("10.9.0.0", 7)))  # a known address is still updated
    assert s.links["a"]["b"]["10.9.0.0"].rtt_us == 7


def test_probe_targets_are_the_peers_ipv4_addresses_never_wildcard_or_another_hosts_loopback() -> None:
    s = _state(("10.0.1.2", "0.0.0.0", "127.0.0.1", "10.0.2.2", "10.0.1.2", "::1"))
    assert [ip for ip, _ in probe_targets(s, "a", "b")] == ["10.0.1.2", "10.0.2.2"]  # type: ignore[arg-type]
    same_host = _state(("127.0.0.1",), edge="127.0.0.1")
    assert [ip for ip, _ in probe_targets(same_host, "a", "b")] == ["127.0.0.1"]  # type: ignore[arg-type]
    assert probe_targets(s, "a", "zz") == ()  # type: ignore[arg-type]


def test_round_events_publish_news_only_and_lose_an_address_after_refusals() -> None:
    s = _state()
    mem = PeerMemory()
    out = round_events(s, "a", "b", {"10.0.1.2": ("other", (300, 10**8)), "10.0.2.2": ("other", (20_000, 10**6))}, mem)  # type: ignore[arg-type]
    assert [type(e) for e in out] == [LinkMeasured, LinkMeasured]
    s = _run(s, *out)
    steady = {"10.0.1.2": ("other", (350, None)), "10.0.2.2": ("other", (21_000, None))}
    assert round_events(s, "a", "b", steady, mem) == []  # type: ignore[arg-type]
    # one round's spike (a busy node answers late) is not news; a move two rounds in a row is
    spike = {"10.0.1.2": ("other", (30_000, None)), "10.0.2.2": ("other", (21_000, None))}
    assert round_events(s, "a", "b", spike, mem) == []  # type: ignore[arg-type]
    assert round_events(s, "a", "b", steady, mem) == []  # type: ignore[arg-type]
    assert round_events(s, "a", "b", spike, mem) == []  # type: ignore[arg-type]
    moved_twice = round_events(s, "a", "b", spike, mem)  # type: ignore[arg-type]
    assert [e.figures.rtt_us for e in moved_twice] == [30_000]  # type: ignore[attr-defined]
    # the fast address goes down: refused twice, then lost; inconclusive rounds never lose it
    down = {"10.0.1.2": ("other", Unreachable("x")), "10.0.2.2": ("other", (21_000, None))}
    assert round_events(s, "a", "b", {"10.0.1.2": ("other", Inconclusive("busy"))}, mem, ["10.0.1.2", "10.0.2.2"]) == []  # type: ignore[arg-type,dict-item]
    results = [round_events(s, "a", "b", down, mem) for _ in range(LOSE_AFTER)]  # type: ignore[arg-type]
    assert results[:-1] == [[]] * (LOSE_AFTER - 1) and results[-1] == [LinkLost("a", "b", "10.0.1.2")]  # type: ignore[arg-type]
    # an address the peer no longer lists is retracted
    assert round_events(s, "a", "b", {"10.0.1.2": ("other", (300, None))}, PeerMemory()) == [LinkLost("a", "b", "10.0.2.2")]  # type: ignore[arg-type,dict-item]


def test_a_figure_event_is_small() -> None:
    import msgspec

    from exo_p2p.types import LocalEvent

    ev = LocalEvent("a" * 52, "boot" * 8, 10**6, LinkMeasured("a" * 52, "b" * 52, LinkFigures("192.168.100.200", 123_000, 1_200_000_000, "ethernet")))  # type: ignore[arg-type]
    assert len(msgspec.msgpack.encode(ev)) < 400


def test_a_node_reports_only_the_figures_it_measured() -> None:
    from master.local_rules import refuse_local

    s = _state()
    assert refuse_local(s, "a", LinkMeasured("a", "b", LinkFigures("10.0.1.2", 300))) is None  # type: ignore[arg-type]
    assert refuse_local(s, "a", LinkLost("a", "b", "10.0.1.2")) is None  # type: ignore[arg-type]
    assert refuse_local(s, "b", LinkMeasured("a", "b", LinkFigures("10.0.1.2", 300))) == "link figures from another node"  # type: ignore[arg-type]
    assert refuse_local(s, "b", LinkLost("a", "b", "10.0.1.2")) == "link figures from another node"  # type: ignore[arg-type]
