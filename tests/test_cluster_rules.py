"""The pure rules of the cluster collaborators (``exo_p2p.cluster``), tested without
processes, sockets or a trio loop; and the size bounds that keep the cluster core readable."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p import defaults
from exo_p2p.cluster.chunks import chunk_bytes, take_batch
from exo_p2p.cluster.commands import retry_pause
from exo_p2p.cluster.command_access import NOT_MEMBER
from exo_p2p.cluster.common import Counters, Role
from exo_p2p.cluster.election import Seat, election_step, settle_for
from exo_p2p.cluster.heartbeats import DUPLICATE, OWN, commit_point, disconnected_for, heartbeat_verdict
from exo_p2p.cluster.log_sync import fetch_sources, global_batch_verdict, takes_snapshot
from exo_p2p.cluster.mesh import dial_plan, edge_changes, ip_of, on_the_way
from exo_p2p.cluster.messages import Heartbeat, IndexedEventBatch, LocalEventBatch, encode
from exo_p2p.cluster.outbox import LocalOutbox, batches, due, first_sends
from exo_p2p.cluster.role import start_settle
from exo_p2p.cluster.sequencing import committed, first_batch, own_events
from exo_p2p.cluster.settings import ClusterSettings
from exo_p2p.types import (
    CommandResult, EmbeddingChunk, ErrorInfo, ImageChunk, IndexedEvent, LocalEvent, NodeTimedOut, TokenChunk, TopologyEdge, TopologyEdgeCreated, TopologyEdgeDeleted,
)

PROJECT_DIRS = [Path(__file__).resolve().parents[1] / name for name in ("exo_p2p", "master", "worker")]
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 60


def hb(node: str, term: int = 0, master: str | None = None, last_idx: int = 0, boot: str = "boot-1",
       version: int | None = None) -> Heartbeat:
    extra = {} if version is None else {"version": version}
    return Heartbeat(node_id=node, boot_id=boot, term=term, master=master, priority=0, last_idx=last_idx,
                     last_term=term, commit_idx=0, **extra)


def local(seq: int, origin: str = "a") -> LocalEvent:
    return LocalEvent(origin, "boot-1", seq, NodeTimedOut(f"n{seq}"))  # type: ignore[arg-type]


# --- size bounds ----------------------------------------------------------------------------------
@pytest.mark.parametrize("path", sorted(p for d in PROJECT_DIRS for p in d.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PROJECT_DIRS[0].parent)))
def test_modules_and_functions_stay_small(path: Path):
    """No module of exo_p2p/, master/ or worker/ over 300 lines, no function there over 60
    lines (nested functions counted on their own and inside their parent)."""
    source = path.read_text()
    assert len(source.splitlines()) <= MAX_MODULE_LINES, f"{path.name}: {len(source.splitlines())} lines"
    long = [
        (node.name, node.end_lineno - node.lineno + 1)  # type: ignore[operator]
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES  # type: ignore[operator]
    ]
    assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {long}"


# --- heartbeats --------------------------------------------------------------------------------------
def test_heartbeat_verdict():
    assert heartbeat_verdict(hb("b"), "b", "a", "boot-a") is None
    assert heartbeat_verdict(hb("b"), "c", "a", "boot-a") == "heartbeat_forged"
    assert heartbeat_verdict(hb("b", version=999), "b", "a", "boot-a") == "heartbeat_version"
    assert heartbeat_verdict(hb("a", boot="boot-a"), "a", "a", "boot-a") == OWN
    assert heartbeat_verdict(hb("a", boot="boot-x"), "a", "a", "boot-a") == DUPLICATE


@given(last=st.integers(0, 100), applied=st.lists(st.integers(0, 150), max_size=5))
def test_commit_point_is_the_best_follower_capped_by_the_log(last, applied):
    following = [hb(f"f{i}", last_idx=n) for i, n in enumerate(applied)]
    point = commit_point(last, following)
    assert point <= last
    assert point == (last if not applied else min(last, max(applied)))


def test_disconnected_for():
    assert not disconnected_for(None, 10.0, 1.0)
    assert not disconnected_for(9.5, 10.0, 1.0)
    assert disconnected_for(9.0, 10.0, 1.0)


# --- election step -------------------------------------------------------------------------------------
def test_election_step_loses_a_master_that_stopped_claiming():
    seat = Seat("b", 3, None)
    step = election_step(seat, hb("a", 3, "b"), [hb("b", 3, None)], (), 50.0, settle=0.5)
    assert step.lost and step.seat == Seat(None, 3, 50.0) and step.claim is None


def test_election_step_follows_a_claim_and_claims_after_settle_alone():
    follow = election_step(Seat(None, 0, 10.0), hb("a"), [hb("b", 2, "b")], (), 11.0, settle=0.5)
    assert follow.follow == "b" and follow.term == 2 and not follow.lost
    waiting = election_step(Seat(None, 0, 10.0), hb("a"), [], (), 10.4, settle=0.5)
    assert waiting.claim is None and waiting.follow is None
    claiming = election_step(Seat(None, 0, 10.0), hb("a"), [], (), 10.5, settle=0.5)
    assert claiming.claim == 1


def test_a_pending_claim_holds_off_the_election_and_restarts_the_masterless_clock():
    step = election_step(Seat(None, 0, None), hb("a"), [], [hb("x", 9, "x")], 100.0, settle=0.5)
    assert step.claim is None and step.seat.masterless_since is None
    later = election_step(step.seat, hb("a"), [], (), 100.1, settle=0.5)
    assert later.seat.masterless_since == 100.1 and later.claim is None


def test_settle_for_and_start_settle():
    assert settle_for(1.0, 0.0, 2.0, 0.5) == 2.0
    assert settle_for(4.0, 0.0, 2.0, 0.5) == 0.5
    # a node that followed a master since it started is past its start: a failover
    assert settle_for(1.0, 0.0, 2.0, 0.5, followed=True) == 0.5
    assert start_settle("a", ["a"], 2.0, 5.0) == 2.0
    assert start_settle("a", ["a", "b"], 2.0, 5.0) == 5.0


# --- local-event outbox -------------------------------------------------------------------------------
@given(sent=st.dictionaries(st.integers(1, 20), st.floats(0, 10)), now=st.floats(0, 20))
def test_due_is_never_sent_or_sent_an_interval_ago_in_order(sent, now):
    pending = {s: local(s) for s in range(1, 21)}
    out = [e.origin_seq for e in due(pending, sent, now, 1.0)]
    assert out == sorted(out)
    assert set(out) == {s for s in pending if s not in sent or now - sent[s] >= 1.0}


def test_first_sends_and_batches():
    events = [local(s) for s in (1, 2, 3)]
    assert first_sends(events, {2: 0.0}) == ([events[0], events[2]], [events[1]])
    assert [len(b.events) for b in batches([local(s) for s in range(1, 6)], 2)] == [2, 2, 1]


def test_first_sends_go_direct_while_the_master_does_not_hear_our_gossip():
    events = [local(s) for s in (1, 2, 3)]
    assert first_sends(events, {2: 0.0}, gossip_reaches=False) == ([], events)
    assert first_sends(events, {}, gossip_reaches=True) == (events, [])


class _RecordingNet:
    """What an outbox sends: ``("gossip", topic)`` or ``("direct", peer, protocol)``."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, ...]] = []

    async def publish(self, topic: str, data: bytes) -> bool:
        self.sent.append(("gossip", topic))
        return True

    async def request(self, peer: str, protocol: str, data: bytes, *, timeout: float) -> bytes:
        self.sent.append(("direct", peer, protocol))
        return b"ok"


@pytest.mark.parametrize("reaches", [False, True])
def test_a_joined_node_sends_its_first_event_direct_until_the_master_hears_its_gossip(reaches):
    """A restarted node's first profile was gossiped while it was still outside the master's
    GossipSub mesh: lost, and indexed only on the direct re-send ``RESEND_INTERVAL`` s later.
    While the master has not said it hears our gossip, the first send goes direct."""
    from exo_p2p.cluster.messages import LOCAL_EVENTS_PROTOCOL, LOCAL_EVENTS_TOPIC

    net = _RecordingNet()
    outbox = LocalOutbox(net, Role("a", master="m"), "boot-a", None, ClusterSettings(), Counters(), clock=trio.current_time)  # type: ignore[arg-type]
    outbox.gossip_reaches = lambda master: reaches and master == "m"

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(outbox.run)
            outbox.send(NodeTimedOut("x"))  # type: ignore[arg-type]
            await trio.sleep(0.1)  # less than a re-send interval
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert net.sent == ([("gossip", LOCAL_EVENTS_TOPIC)] if reaches else [("direct", "m", LOCAL_EVENTS_PROTOCOL)])


def test_a_replaced_log_starts_a_new_epoch_and_requeues_pending_events():
    outbox = LocalOutbox(None, Role("a", master="m"), "boot-a", None, ClusterSettings(), Counters(), clock=lambda: 0.0)  # type: ignore[arg-type]
    outbox.send(NodeTimedOut("x"))  # type: ignore[arg-type]
    outbox.send(NodeTimedOut("y"))  # type: ignore[arg-type]
    outbox.on_applied(IndexedEvent(1, 1, NodeTimedOut("x"), origin="a", origin_boot="boot-a", origin_seq=1), None)  # type: ignore[arg-type]
    assert [e.node_id for e in outbox.pending_events()] == ["y"]
    outbox.on_log_replaced(None)  # type: ignore[arg-type]
    assert outbox.origin_boot == "boot-a.1"
    assert [(s, e.origin_boot) for s, e in outbox.pending.items()] == [(1, "boot-a.1")]


# --- sequencing ----------------------------------------------------------------------------------------
def test_own_events_drops_forged_ones():
    ok, forged = own_events(LocalEventBatch((local(1, "a"), local(2, "b"))), "a")
    assert [e.origin_seq for e in ok] == [1] and forged == 1


def test_first_batch_halves_until_it_fits_and_sends_an_oversize_event_alone():
    outbox = [IndexedEvent(1, i, NodeTimedOut("n" * 100)) for i in range(1, 9)]  # type: ignore[arg-type]
    one = len(encode(IndexedEventBatch(tuple(outbox[:1]))))
    n, data = first_batch(outbox, 64, 3 * one)
    assert n == 2 and len(data) <= 3 * one
    assert first_batch(outbox, 64, 1)[0] == 1
    assert first_batch(outbox, 4, 10**6)[0] == 4


def test_committed():
    assert committed(5, [], "m") is None
    assert committed(5, [hb("b", master="m", last_idx=4), hb("c", master="m", last_idx=5)], "m") is True
    assert committed(5, [hb("b", master="m", last_idx=4)], "m") is False


def test_only_a_follower_of_this_master_commits_its_events():
    """A live peer that is master itself (two masters before they meet) or follows no one
    holds other events at the same indices: its last index commits nothing of ours."""
    assert committed(5, [hb("b", master="b", last_idx=9)], "m") is False
    assert committed(5, [hb("b", master=None, last_idx=9)], "m") is False
    assert committed(5, [hb("b", master="b", last_idx=9), hb("c", master="m", last_idx=5)], "m") is True


# --- log following --------------------------------------------------------------------------------------
def test_global_batch_verdict():
    batch = IndexedEventBatch((IndexedEvent(1, 1, NodeTimedOut("x")),))  # type: ignore[arg-type]
    assert global_batch_verdict(batch, "m", Role("a", master="m")) is None
    assert global_batch_verdict(batch, "x", Role("a", master="m")) == "global_event_not_from_master"
    assert global_batch_verdict(batch, "a", Role("a", master="a", is_master=True)) == "global_event_not_from_master"


def test_fetch_sources_are_same_master_same_term_most_advanced_first():
    peers = [hb("b", 2, "m", 5), hb("c", 2, "m", 9), hb("d", 1, "m", 20), hb("e", 2, "x", 30), hb("m", 2, "m", 40)]
    assert fetch_sources("m", 2, peers, 3) == ["c", "b"]
    assert fetch_sources("m", 2, peers, 1) == ["c"]


def test_a_former_master_with_a_later_term_in_its_log_is_no_fetch_source():
    """A node that was master at term 3 and follows m at term 2 now (it lost the meeting of
    masters) holds its own term-3 tail until it syncs: it cannot stand in for m's log."""
    former = Heartbeat(node_id="f", boot_id="boot-1", term=2, master="m", priority=0, last_idx=50, last_term=3, commit_idx=0)
    assert fetch_sources("m", 2, [former, hb("b", 2, "m", 5)], 3) == ["b"]


def test_only_a_fetch_from_the_master_ends_the_check_of_the_tail():
    """After following a master, a follower checks once that its tail agrees with the
    master's log. With the master unreachable, a fallback peer's answer gives events but
    does not end the check: the follower keeps asking the master."""
    from exo_p2p.cluster.log_sync import LogFollower
    from exo_p2p.cluster.messages import LogResponse

    class Net:
        def __init__(self) -> None:
            self.asked: list[str] = []

        async def request(self, peer: str, protocol: str, data: bytes, *, timeout: float) -> bytes:
            self.asked.append(peer)
            if peer == "m":
                raise OSError("unreachable")
            return encode(LogResponse(events=(), last_idx=0))

    class Replica:
        last_idx, last_term = 0, 0

        def chain_at(self, _idx: int) -> bytes:
            return b""

        def offer_many(self, _events: list) -> list:  # type: ignore[type-arg]
            return []

        def missing_range(self) -> None:
            return None

    class Peers:
        liveness: dict = {}

    net = Net()
    follower = LogFollower(net, Replica(), Role("a", master="m", term=2), Peers(), ClusterSettings(), Counters(), None)  # type: ignore[arg-type]

    async def main() -> None:
        assert not await follower.fetch_from("m")
        assert await follower.fetch_from("b")
        assert follower._behind("m"), "a fallback peer's answer ended the check against the master"

    trio.run(main)
    assert net.asked == ["m", "b"]


def test_only_peers_ahead_of_this_node_are_fetch_sources():
    """A peer behind this node holds nothing it lacks; asked anyway it would answer
    "diverged" with its older State (the asker's tail is longer than its log)."""
    peers = [hb("b", 2, "m", 5), hb("c", 2, "m", 9), hb("d", 2, "m", 7)]
    assert fetch_sources("m", 2, peers, 3, after=7) == ["c"]
    assert fetch_sources("m", 2, peers, 3, after=9) == []
    assert fetch_sources("m", 2, peers, 3, after=0) == ["c", "d", "b"]


@given(snapshot_idx=st.integers(0, 50), last_idx=st.integers(0, 50), from_master=st.booleans())
def test_a_fallback_peers_snapshot_never_rewinds_this_node(snapshot_idx, last_idx, from_master):
    taken = takes_snapshot("m" if from_master else "b", "m", snapshot_idx, last_idx)
    if from_master:
        assert taken  # the master's log is the cluster's: a tail it lacks is dropped
    else:
        assert taken == (snapshot_idx >= last_idx)


def test_an_older_snapshot_from_a_fallback_peer_is_refused():
    """The master is unreachable; the only peer answering is behind this node (its last
    heartbeat said more, or it lost events since) and answers with its older State. This
    node keeps its own State: installing that snapshot would drop events 41..60, which the
    master may have answered as committed because this node held them."""
    from exo_p2p.cluster.log_sync import LogFollower
    from exo_p2p.cluster.messages import LogResponse
    from exo_p2p.types import State

    class Net:
        async def request(self, peer: str, protocol: str, data: bytes, *, timeout: float) -> bytes:
            if peer == "m":
                raise OSError("unreachable")
            return encode(LogResponse(snapshot=State(last_event_idx=40), last_idx=40, diverged=True))

    class Replica:
        last_idx, last_term = 60, 2
        installed: list = []

        def chain_at(self, _idx: int) -> bytes:
            return b""

        def install_snapshot(self, state, digest=None) -> None:  # type: ignore[no-untyped-def]
            self.installed.append(state.last_event_idx)

        def offer_many(self, _events: list) -> list:  # type: ignore[type-arg]
            return []

    class Peers:
        liveness: dict = {}

    replica, counters = Replica(), Counters()
    follower = LogFollower(Net(), replica, Role("a", master="m", term=2), Peers(), ClusterSettings(), counters, None)  # type: ignore[arg-type]

    async def main() -> None:
        assert not await follower.fetch_from("m")
        assert not await follower.fetch_from("b"), "an older snapshot counted as a successful fetch"

    trio.run(main)
    assert replica.installed == [], "this node's State was rewound to a fallback peer's older snapshot"
    assert counters.get("log_snapshot_behind") == 1


# --- mesh -------------------------------------------------------------------------------------------------
def test_dial_plan_staggers_the_larger_id_and_backs_off():
    backoff: dict = {}
    assert dial_plan(["a", "b", "c"], own="b", connected=["a"], known_at_boot=[], backoff=backoff, now=0.0) == ["c"]
    assert "a" not in backoff and backoff["c"] == (defaults.MESH_BACKOFF_FIRST, 2 * defaults.MESH_BACKOFF_FIRST)
    assert dial_plan(["c"], own="b", connected=[], known_at_boot=[], backoff=backoff, now=0.1) == []
    assert dial_plan(["c"], own="b", connected=[], known_at_boot=[], backoff=backoff, now=0.5) == ["c"]
    assert dial_plan(["a"], own="b", connected=[], known_at_boot=[], backoff=backoff, now=0.0) == []
    assert dial_plan(["a"], own="b", connected=[], known_at_boot=[], backoff=backoff, now=defaults.MESH_STAGGER) == ["a"]
    assert dial_plan(["z"], own="zz", connected=[], known_at_boot=["z"], backoff={}, now=0.0) == ["z"]
    wait = defaults.MESH_BACKOFF_FIRST
    for _ in range(20):
        wait = min(defaults.MESH_BACKOFF_MAX, 2 * wait)
    assert wait == defaults.MESH_BACKOFF_MAX


peers_st = st.sets(st.sampled_from(["b", "c", "d", "e", "f"]))


@settings(max_examples=300)
@given(mine=peers_st, in_state=peers_st, connected=peers_st, on_way=peers_st, announcing=peers_st,
       gone=st.dictionaries(st.sampled_from(["b", "c", "d", "e", "f"]), st.floats(0, 10)), now=st.floats(0, 10))
def test_edge_changes(mine, in_state, connected, on_way, announcing, gone, now):
    announce, retract = edge_changes(mine=mine, in_state=in_state, connected=connected, on_the_way=on_way,
                                     announcing=announcing, disconnected_at=gone, started_at=0.0, now=now, grace=2.0)
    # connected peers in State with no edge and none on its way are always announced
    assert announce == {p for p in connected & in_state if p not in mine | on_way | announcing}
    # nothing on its way is announced or retracted twice; a connected peer's edge is never retracted
    assert not (announce | retract) & on_way and not retract & connected
    # an edge is never retracted within the grace
    assert all(now - gone.get(p, 0.0) >= 2.0 for p in retract)


def test_on_the_way_and_ip_of():
    events = [TopologyEdgeCreated(TopologyEdge("a", "b", "10.0.0.2")), TopologyEdgeDeleted("a", "c"), NodeTimedOut("d")]
    assert on_the_way(events) == {"b", "c"}  # type: ignore[arg-type]
    assert ip_of(["/ip4/0.0.0.0/tcp/1", "/ip4/10.0.0.7/tcp/1"]) == "10.0.0.7"
    assert ip_of(["/ip6/::1/tcp/1"]) == ""


# --- commands, chunks, counters ---------------------------------------------------------------------------
def _result(code: str | None) -> CommandResult:
    return CommandResult("c1", error=None if code is None else ErrorInfo(503, "x", "server_error", code=code))  # type: ignore[arg-type]


def test_retry_pause():
    assert retry_pause(_result(None), 10.0) is None
    assert retry_pause(_result("not_master"), 10.0) == defaults.NOT_MASTER_PAUSE
    assert retry_pause(_result(NOT_MEMBER), 10.0) == defaults.COMMAND_RETRY_PAUSE
    assert retry_pause(_result(NOT_MEMBER), defaults.NOT_MEMBER_MIN_LEFT / 2) is None
    assert retry_pause(_result("no_capacity"), 10.0) is None


def _token(i: int) -> tuple[TokenChunk, int]:
    return TokenChunk(task_id="t", token_id=i, text="x", completion_tokens=i), i


def test_take_batch_takes_what_is_queued_up_to_the_limit():
    send, receive = trio.open_memory_channel(100)
    for i in range(5):
        send.send_nowait(_token(i))
    assert take_batch(_token(-1), receive, 4) == ([_token(-1), _token(0), _token(1), _token(2)], None)
    assert take_batch(_token(-2), receive, 4) == ([_token(-2), _token(3), _token(4)], None)


def test_take_batch_keeps_a_batch_under_its_byte_bound():
    """Vectors travel in batches under ``max_bytes``; the chunk that would pass it is carried
    to the next batch, and a chunk over the bound alone still travels (alone)."""
    def vectors(i: int, n: int) -> tuple[EmbeddingChunk, int]:
        return EmbeddingChunk(task_id="t", vectors=bytes(n), count=1, dimensions=n // 4), i

    send, receive = trio.open_memory_channel(100)
    for item in (vectors(1, 4096), vectors(2, 4096), vectors(3, 40_000), vectors(4, 4096)):
        send.send_nowait(item)
    batch, carry = take_batch(vectors(0, 4096), receive, 256, max_bytes=3 * (1024 + 4096))
    assert [s for _, s in batch] == [0, 1, 2] and carry is not None and carry[1] == 3
    batch, carry = take_batch(carry, receive, 256, max_bytes=3 * (1024 + 4096))
    assert [s for _, s in batch] == [3] and carry is not None and carry[1] == 4
    assert chunk_bytes(vectors(0, 4096)[0]) == 1024 + 4096


def test_an_image_chunk_counts_its_png_bytes():
    """Images travel as chunks too: their PNG bytes count against the batch bound."""
    image = ImageChunk(task_id="t", image=bytes(50_000), width=64, height=64, step=4, steps=4)
    assert chunk_bytes(image) == 1024 + 50_000


def test_counters():
    counters = Counters()
    counters.drop("x")
    counters.drop("x")
    counters.add("y", 3)
    assert counters == {"x": 2, "y": 3}


# --- the defaults tables quote exo_p2p.defaults ------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]


def _table_rows(text: str) -> dict[str, str]:
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`") and cells[0].endswith("`") and cells[0][1:-1].isupper():
            rows[cells[0][1:-1]] = cells[1]
    return rows


def _constants() -> dict[str, float]:
    return {k: v for k, v in vars(defaults).items() if k.isupper() and isinstance(v, (int, float))}


@pytest.mark.parametrize("document", ["docs/cluster.md", "docs/architecture.md"])
def test_defaults_tables_quote_the_defaults_module(document):
    rows = _table_rows((ROOT / document).read_text())
    constants = _constants()
    assert rows, f"no defaults table in {document}"
    wrong = {name: value for name, value in rows.items() if name in constants and float(value) != constants[name]}
    assert not wrong, f"{document} quotes other values than exo_p2p/defaults.py: {wrong}"
    if document == "docs/architecture.md":  # the full table; docs/cluster.md quotes the main ones
        assert set(constants) <= set(rows), f"missing from {document}: {sorted(set(constants) - set(rows))}"


# --- layers (docs/architecture.md, "Layers") -----------------------------------------------------------
def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _violations(folder: str, forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel in allowed:
            continue
        bad += [(rel, m) for m in _imports(path) if any(m == f or m.startswith(f + ".") for f in forbidden)]
    return bad


def test_layers():
    assert not _violations("master", ("worker", "exo_p2p.node", "exo_p2p.api", "exo_p2p.cli"))
    assert not _violations("worker", ("master", "exo_p2p.node", "exo_p2p.api", "exo_p2p.cli"))
    composition = ("exo_p2p/node/node.py", "exo_p2p/node/seat.py", "exo_p2p/node/placement.py", "exo_p2p/node/worker_env.py")
    assert not _violations("exo_p2p", ("master", "worker"), allowed=composition + tuple(
        str(p.relative_to(ROOT)) for p in (ROOT / "exo_p2p" / "cli").rglob("*.py")))
    for folder in ("exo_p2p/types", "exo_p2p/state", "exo_p2p/net", "exo_p2p/cluster"):
        assert not _violations(folder, ("exo_p2p.api", "exo_p2p.cli", "exo_p2p.node")), folder


def test_no_reference_to_documents_outside_the_repository():
    """Code, tests, scripts and docs point at docs/architecture.md or module docstrings only."""
    outside = [name + ".md" for name in ("design", "cases", "style", "libp2p-notes", "cluster-split")] + ["/work/" + "shared", "../" + "shared"]
    hits = []
    for folder in ("exo_p2p", "master", "worker", "tests", "scripts", "docs"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in {".py", ".sh", ".md", ".js", ".html", ".toml"} and path.is_file():
                text = path.read_text(errors="replace")
                hits += [(str(path.relative_to(ROOT)), word) for word in outside if word in text]
    readme = (ROOT / "README.md").read_text()
    hits += [("README.md", word) for word in outside if word in readme]
    assert not hits, hits


def _bookkeeping_pattern(hash_numbers: bool = True):
    """Work-tracking references (tracker numbers and their items, session numbers, CI run
    names, field-case ids, and with ``hash_numbers`` a bare ``#N``: not for JS/HTML, where a
    CSS colour is written so), built from pieces so this module's own source does not match. A
    word and its number may be split across a line break, also inside a ``#`` comment."""
    import re

    gap = r"(?:[ \t]+|[ \t]*\n[ \t#]*)"  # between a word and its number
    forms = [
        r"\b[Ii]ss" + r"ues?" + gap + r"#?[0-9]+",
        r"\b[Ss]ess" + r"ion" + gap + r"[0-9]",
        r"\bc" + r"i[0-9]{1,3}\b",
        r"\b[Ii]te" + r"ms?" + gap + r"[0-9]+",
        r"\b(?:[Ff]ield" + gap + r")?[Cc]as" + r"es?" + gap + r"[A-Z][0-9]+",
        r"\b(?:[Ff]ield" + gap + r")[Cc]as" + r"es?" + gap + r"[0-9]+",
        r"\b" + r"B[0-9]{2}\b",
    ]
    if hash_numbers:
        forms.append(r"(?<![\w&#/])" + "#" + r"[0-9]{1,3}\b")
    return re.compile("|".join(forms))


def test_code_and_tests_name_no_issue_numbers():
    """Comments and docstrings say what they mean (a rule's name, a module, docs/) instead of
    work-tracking references: no tracker or item numbers, session numbers, CI run names,
    field-case ids."""
    patterns = {True: _bookkeeping_pattern(), False: _bookkeeping_pattern(hash_numbers=False)}
    paths = [p for folder in ("exo_p2p", "master", "worker", "tests", "scripts") for p in (ROOT / folder).rglob("*.py")]
    paths += list((ROOT / "scripts").glob("*.sh"))
    paths += [p for p in (ROOT / "exo_p2p" / "dashboard").rglob("*") if p.suffix in {".js", ".html"}]
    hits = []
    for path in sorted(paths):
        text = path.read_text(errors="replace")
        for m in patterns[path.suffix in {".py", ".sh"}].finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            hits.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0)!r}")
    assert not hits, "\n".join(hits)
