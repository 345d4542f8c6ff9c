"""Lossy gossip, its event-log part: gossip that a node receives is dropped,
duplicated and reordered, and the event log still reaches it whole, in order, exactly once.

The rule that mistreats gossip (``exo_p2p.cluster.faults``) is tested first on its own; the
multi-process test then runs it inside a real node (``--fault-hook gossip_*``).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import httpx
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p.cluster.faults import FaultyReceiver, GossipFaults, gossip_faults_from_hooks
from exo_p2p.cluster.messages import GLOBAL_EVENTS_TOPIC, LOCAL_EVENTS_TOPIC
from exo_p2p.eventlog import EventLog
from exo_p2p.types import MasterElected
from tests.support.cluster import Cluster, agreement, self_id, state_of, wait_until

MODEL = "tiny"


# --- the rule ---------------------------------------------------------------------------------

def _run_all(faults: GossipFaults, messages: list) -> list:
    out: list = []
    for m in messages:
        out += faults.admit(m)
    return out + faults.flush()


probability = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(
    messages=st.lists(st.integers(), max_size=60, unique=True),
    drop=probability,
    dup=probability,
    reorder=st.integers(0, 6),
    seed=st.integers(0, 2**32),
)
def test_faults_only_drop_duplicate_and_permute_and_count_what_they_do(messages, drop, dup, reorder, seed):
    faults = GossipFaults(drop=drop, dup=dup, reorder=reorder, seed=seed)
    out = _run_all(faults, messages)
    seen = Counter(out)
    assert set(seen) <= set(messages)  # nothing invented
    assert all(n in (1, 2) for n in seen.values())
    assert faults.dropped == sum(1 for m in messages if m not in seen)
    assert faults.duplicated == sum(1 for n in seen.values() if n == 2)
    assert faults.held == 0
    # the same seed and input give the same output (reproducible runs)
    assert _run_all(GossipFaults(drop=drop, dup=dup, reorder=reorder, seed=seed), messages) == out


@settings(max_examples=200, deadline=None)
@given(messages=st.lists(st.integers(), max_size=60, unique=True), reorder=st.integers(2, 6), seed=st.integers(0, 2**32))
def test_reordering_permutes_within_windows_only(messages, reorder, seed):
    faults = GossipFaults(reorder=reorder, seed=seed)
    released: list[list] = []
    for m in messages:
        got = faults.admit(m)
        assert len(got) in (0, reorder)
        if got:
            released.append(got)
    if faults.held:
        released.append(faults.flush())
    windows = [messages[i : i + reorder] for i in range(0, len(messages), reorder)]
    assert [sorted(w) for w in released] == [sorted(w) for w in windows]
    assert faults.reordered == sum(1 for got, w in zip(released, windows) if got != w)


def test_no_faults_is_the_identity_and_rates_are_roughly_as_asked():
    messages = list(range(200))
    assert _run_all(GossipFaults(seed=3), messages) == messages
    faults = GossipFaults(drop=0.05, dup=0.05, seed=3)
    _run_all(faults, list(range(20_000)))
    assert 800 <= faults.dropped <= 1200  # 5 % of 20 000, ± 4.5 sigma
    assert 750 <= faults.duplicated <= 1150  # 5 % of the ~19 000 kept


def test_hooks_select_the_faults():
    assert gossip_faults_from_hooks({}, GLOBAL_EVENTS_TOPIC) is None
    assert gossip_faults_from_hooks({"free_memory": "5"}, GLOBAL_EVENTS_TOPIC) is None
    hooks = {"gossip_drop": "0.05", "gossip_dup": "0.1", "gossip_reorder": "3", "gossip_seed": "7"}
    g = gossip_faults_from_hooks(hooks, GLOBAL_EVENTS_TOPIC)
    local = gossip_faults_from_hooks(hooks, LOCAL_EVENTS_TOPIC)
    assert g is not None and local is not None
    assert (g.drop, g.dup, g.reorder) == (0.05, 0.1, 3)
    assert g.seed != local.seed  # two topics do not make the same decisions
    assert g.seed == gossip_faults_from_hooks(hooks, GLOBAL_EVENTS_TOPIC).seed  # stable
    with pytest.raises(ValueError):
        gossip_faults_from_hooks({"gossip_drop": "often"}, GLOBAL_EVENTS_TOPIC)
    with pytest.raises(ValueError):
        gossip_faults_from_hooks({"gossip_dup": "1.5"}, GLOBAL_EVENTS_TOPIC)


def test_receiver_applies_the_rule_and_releases_a_partial_window_after_hold():
    messages = [("peer", bytes([i])) for i in range(50)]
    expected = _run_all(GossipFaults(drop=0.1, dup=0.1, reorder=3, seed=11), messages)
    counted: Counter = Counter()

    async def main() -> list:
        send, recv = trio.open_memory_channel(100)
        faulty = FaultyReceiver(recv, GossipFaults(drop=0.1, dup=0.1, reorder=3, seed=11), hold=0.3, on_count=lambda k, n: counted.update({k: n}))
        for m in messages:
            send.send_nowait(m)
        await send.aclose()
        return [m async for m in faulty]

    assert trio.run(main) == expected
    faults = GossipFaults(drop=0.1, dup=0.1, reorder=3, seed=11)
    _run_all(faults, messages)
    assert counted == Counter({k: v for k, v in (("dropped", faults.dropped), ("duplicated", faults.duplicated), ("reordered", faults.reordered)) if v})

    async def lone() -> float:
        # one message and no more traffic: released after ``hold`` seconds, not never
        send, recv = trio.open_memory_channel(10)
        faulty = FaultyReceiver(recv, GossipFaults(reorder=3), hold=0.3)
        send.send_nowait(("peer", b"x"))
        start = trio.current_time()
        with trio.fail_after(5):
            assert await faulty.__anext__() == ("peer", b"x")
        return trio.current_time() - start

    took = trio.run(lone, clock=trio.testing.MockClock(autojump_threshold=0))
    assert 0.3 <= took < 0.4


# --- the cluster ------------------------------------------------------------------------------

LOSSY = ["gossip_drop=0.05", "gossip_dup=0.05", "gossip_reorder=3", "gossip_seed=12"]
GEN_TOKENS = 500
LOAD_TIMEOUT = 45.0
SETTLE_TIMEOUT = 20.0


def _stream(node, result: dict) -> None:
    """Stream a greedy ``GEN_TOKENS``-token chat; fill ``result`` with the SSE lines, the
    usage, the finish reason and the HTTP status."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "go on forever"}],
        "max_tokens": GEN_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    try:
        with httpx.stream("POST", node.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(60, connect=10)) as r:
            result["status"] = r.status_code
            for line in r.iter_lines():
                if not line:
                    continue
                result["lines"].append(line)
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[len("data: ") :])
                if chunk.get("usage"):
                    result["usage"] = chunk["usage"]
                for choice in chunk.get("choices", []):
                    if choice.get("finish_reason"):
                        result["finish_reason"] = choice["finish_reason"]
    except httpx.HTTPError as exc:
        result["lines"].append(f"transport error: {exc!r}")
    result["done"] = True


def _counters(node) -> dict:
    s = state_of(node)
    assert s is not None, node.log_tail()
    return s["counters"]


def _read_log(data_dir) -> list:
    log = EventLog(data_dir / "events.log")
    try:
        return list(log)
    finally:
        log.close()


def _origin_holes(events: list, origin: str) -> tuple[int, int]:
    """``(holes, repeats)`` in the per-origin sequence numbers of ``origin`` (every boot and
    epoch) in ``events``: numbers missing between the smallest and largest seen (as
    scripts/chaos.py ``log_holes``), and numbers indexed more than once."""
    seqs: dict[str, list[int]] = {}
    for e in events:
        if e.origin == origin:
            seqs.setdefault(e.origin_boot, []).append(e.origin_seq)
    holes = sum(max(s) - min(s) + 1 - len(set(s)) for s in seqs.values())
    repeats = sum(len(s) - len(set(s)) for s in seqs.values())
    return holes, repeats


def _hit(counters: dict, topic: str) -> bool:
    """Whether the faults dropped, duplicated and reordered at least one message of ``topic``."""
    return all(counters.get(f"fault_{k}:{topic}", 0) > 0 for k in ("dropped", "duplicated", "reordered"))


def _short_chats(api, lossy, topic: str, *, until=lambda: True, at_least: int = 5) -> list[int]:
    """Send short greedy chats to ``api`` one after the other until ``until()`` holds, at
    least ``at_least`` were sent and the faults of ``lossy`` hit ``topic`` (bounded by
    ``LOAD_TIMEOUT``); returns their HTTP statuses."""
    statuses: list[int] = []
    deadline = time.monotonic() + LOAD_TIMEOUT
    while time.monotonic() < deadline and not (until() and len(statuses) >= at_least and _hit(_counters(lossy), topic)):
        r = api.chat(f"short {len(statuses)}", MODEL, max_tokens=3, temperature=0, timeout=30)
        statuses.append(r.status_code)
    return statuses


def _settled(nodes, follower):
    """``agreement`` of ``nodes`` once ``follower`` has no local event in flight, else None."""
    return agreement(nodes, 2) if _counters(follower)["local_events_pending"] == 0 else None


@pytest.mark.integration
def test_lossy_gossip_is_recovered_while_a_remote_instance_streams(tmp_path, models_dir):
    """Lossy gossip: the node hosting a 1-node instance (not the API node, not the master) drops 5 %,
    duplicates 5 % and reorders windows of 3 of the events gossip it receives, while the API
    node streams a 500-token greedy generation from it and sends short chats besides."""
    cluster = Cluster(tmp_path, 1, extra_args=["--models-dir", str(models_dir)])
    try:
        cluster.start()
        api = cluster.nodes[0]
        extra = [arg for hook in LOSSY for arg in ("--fault-hook", hook)]
        lossy = cluster.add("lossy", bootstrap=api.addrs(), extra=extra)
        agreed = wait_until(lambda: agreement(cluster.nodes, 2), 30, what="2 nodes agree")
        api_id, lossy_id = self_id(api), self_id(lossy)
        master, term0 = agreed[0], agreed[1]
        assert master == api_id  # the lossy node is a follower: it gets the log by gossip
        r = api.post("/instances", json={"model": MODEL, "nodes": [lossy_id]})
        assert r.status_code == 201, r.text
        iid = r.json()["instance_id"]
        wait_until(lambda: api.get(f"/instances/{iid}").json()["status"] == "ready", 60, what="instance ready")
        shards = state_of(api)["instances"][iid]["shards"]
        assert [s["node_id"] for s in shards] == [lossy_id]
        before = _counters(lossy)

        # the load: one long stream, short chats beside it until the faults demonstrably hit
        result: dict = {"lines": [], "status": None, "usage": None, "finish_reason": None, "done": False}
        streamer = threading.Thread(target=_stream, args=(api, result), daemon=True)
        streamer.start()
        short_status = _short_chats(api, lossy, GLOBAL_EVENTS_TOPIC, until=lambda: result["done"])
        streamer.join(30)
        assert result["done"], "stream still open"
        assert result["status"] == 200, result["lines"][-3:]
        assert result["usage"] is not None and result["usage"]["completion_tokens"] == GEN_TOKENS, result["usage"]
        assert result["finish_reason"] == "length"
        assert result["lines"][-1] == "data: [DONE]"
        assert not any('"error"' in line or line.startswith("transport error") for line in result["lines"])
        assert short_status and all(s == 200 for s in short_status), short_status

        # settled: same log and State on both nodes, nothing of the lossy node's in flight
        final = wait_until(lambda: _settled(cluster.nodes, lossy), SETTLE_TIMEOUT, what="agreement after the load")
        after = _counters(lossy)
        assert final[0] == master and final[1] == term0, (final, term0)  # no election
        assert _hit(after, GLOBAL_EVENTS_TOPIC), {k: v for k, v in after.items() if k.startswith("fault_")}
        assert after.get("log_fetch_applied", 0) > before.get("log_fetch_applied", 0), "no gap was filled by log fetch"
        assert after.get("global_event_duplicate", 0) > before.get("global_event_duplicate", 0), "duplicates were not seen (ignored by index)"
        print(f"lossy gossip: {len(short_status)} short chats, last idx {final[2]}, lossy counters:",
              {k: v for k, v in after.items() if k.startswith(("fault_", "log_fetch", "global_event"))})
        # the follower first: a master stopped first would leave it to elect itself
        lossy.stop()
        api.stop()
    finally:
        cluster.stop()

    # after the nodes stopped: both logs hold 1..N in order, exactly once, the same events;
    # every local event the lossy node emitted is in the master's log (no hole in its
    # origin sequence numbers) and only one master was ever elected
    master_log, lossy_log = _read_log(api.data_dir), _read_log(lossy.data_dir)
    for log in (master_log, lossy_log):
        assert [e.idx for e in log] == list(range(1, len(log) + 1))
    assert len(lossy_log) >= final[2] and lossy_log == master_log[: len(lossy_log)]
    assert _origin_holes(master_log, lossy_id) == (0, 0)
    assert any(e.origin == lossy_id for e in master_log)
    assert sum(isinstance(e.event, MasterElected) for e in master_log) == 1


@pytest.mark.integration
def test_lossy_master_still_indexes_every_local_event_of_a_follower_once(tmp_path, models_dir):
    """Lossy gossip, the other topic: the master drops 5 %, duplicates 5 % and reorders windows of 3
    of the local events it receives, while the follower hosting a 1-node instance emits the
    runner and task events of short chats sent to the master's API: every one of them is
    indexed exactly once (re-sent until seen indexed, de-duplicated per origin)."""
    extra = [arg for hook in LOSSY for arg in ("--fault-hook", hook)]
    cluster = Cluster(tmp_path, 1, extra_args=["--models-dir", str(models_dir), *extra])
    try:
        cluster.start()
        lossy = cluster.nodes[0]
        follower = cluster.add("follower", bootstrap=lossy.addrs(), extra=[])
        agreed = wait_until(lambda: agreement(cluster.nodes, 2), 30, what="2 nodes agree")
        lossy_id, follower_id = self_id(lossy), self_id(follower)
        assert agreed[0] == lossy_id  # the lossy node is the master: it receives local events
        r = lossy.post("/instances", json={"model": MODEL, "nodes": [follower_id]})
        assert r.status_code == 201, r.text
        iid = r.json()["instance_id"]
        wait_until(lambda: lossy.get(f"/instances/{iid}").json()["status"] == "ready", 60, what="instance ready")
        statuses = _short_chats(lossy, lossy, LOCAL_EVENTS_TOPIC)
        assert statuses and all(s == 200 for s in statuses), statuses
        final = wait_until(lambda: _settled(cluster.nodes, follower), SETTLE_TIMEOUT, what="agreement after the load")
        counters = _counters(lossy)
        assert _hit(counters, LOCAL_EVENTS_TOPIC), {k: v for k, v in counters.items() if k.startswith("fault_")}
        assert final[:2] == agreed[:2]  # same master, same term: no election
        print(f"lossy local events: {len(statuses)} short chats, last idx {final[2]}, master counters:",
              {k: v for k, v in counters.items() if k.startswith(("fault_", "local_event"))})
        follower.stop()
        lossy.stop()
    finally:
        cluster.stop()

    master_log = _read_log(lossy.data_dir)
    assert [e.idx for e in master_log] == list(range(1, len(master_log) + 1))
    assert _origin_holes(master_log, follower_id) == (0, 0)
    assert sum(1 for e in master_log if e.origin == follower_id) >= 2 * len(statuses)  # runner/task events
    assert sum(isinstance(e.event, MasterElected) for e in master_log) == 1
