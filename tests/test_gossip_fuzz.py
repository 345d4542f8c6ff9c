"""Bad input on gossip topics and request/response streams (docs/architecture.md#wire-and-storage).

A rogue peer (``tests/support/net/rogue_peer.py``: its own libp2p identity, so it can only sign as
itself) joins a real cluster of node processes and sends hostile traffic on every topic and
protocol. Expected: every bad message is dropped and counted (``GET /state`` "counters"),
never applied; no node crashes; all nodes keep one State (same ``state_hash``); the cluster
still places and serves afterwards.

The rogue is a cluster member (no cluster secret here), so well-formed commands it sends over
``/exo-p2p/command/1`` may legitimately place or delete instances; what it must never do is
make the master record facts that are not its own (another node's runner failing, master-only
events) or write into another client's token stream.
"""

from __future__ import annotations

import random
import threading
import time

import httpx
import msgspec
import pytest

from exo_p2p.cluster.messages import (
    CHUNKS_PROTOCOL,
    COMMAND_PROTOCOL,
    GLOBAL_EVENTS_TOPIC,
    HEARTBEATS_TOPIC,
    LOCAL_EVENTS_TOPIC,
    LOG_PROTOCOL,
    ChunkBatch,
    Heartbeat,
    LocalEventBatch,
    LogRequest,
    LogResponse,
)
from exo_p2p.types import (
    CommandEnvelope,
    FinishChunk,
    IndexedEvent,
    InstanceDeleted,
    LocalEvent,
    MasterElected,
    NodeProfile,
    NodeProfileUpdated,
    NodeTimedOut,
    PlaceInstance,
    RunnerFailed,
    RunnerStatusUpdated,
    TokenChunk,
    TopologyEdge,
    TopologyEdgeCreated,
)
from tests.conftest import tiny_models_dir
from tests.support.cluster import Cluster, NodeProcess, agreement, self_id, state_of, wait_until
from tests.support.net.rogue_peer import RogueProcess

pytestmark = pytest.mark.integration
MODEL = "tiny"
encode = msgspec.msgpack.encode
ROGUE_BOOT = "rogue-boot"


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tiny_models_dir(tmp_path_factory, n_layers=4, hidden_size=64, intermediate_size=128, seed=7)


def _counters(node: NodeProcess) -> dict[str, int]:
    return node.get("/state", timeout=5).json()["counters"]


def _junk_payloads(rng: random.Random) -> list[bytes]:
    """Random bytes, truncated msgpack, valid msgpack of the wrong schema (bytes ≤ 2 KiB)."""
    out = [b"", b"\x00", b"\xc1", b"\xff" * 7, b"\x93\x01\x02"]  # \xc1 never valid; truncated array
    out += [rng.randbytes(rng.randrange(1, 2048)) for _ in range(6)]
    out += [encode(x) for x in ({"node_id": 5}, [1, 2, 3], None, 2**63, {"kind": "nope", "version": 1}, "x" * 100, {"events": "no"}, {"term": -1, "idx": "a", "event": {}})]
    return out


def _start_rogue(tmp_path, nodes: list[NodeProcess]) -> RogueProcess:
    boot = [a for n in nodes for a in n.addrs()]
    rogue = RogueProcess(tmp_path / "rogue", boot).start()
    ids = {self_id(n) for n in nodes}
    wait_until(lambda: ids <= set(rogue.call("ping", timeout=10)["peers"]), 20, what="rogue connected to every node")
    time.sleep(2.5)  # two gossipsub heartbeats: the rogue is in every topic's mesh
    return rogue


def _local_batch(rogue_id: str, events: list, first_seq: int = 1, origin: str | None = None, version: int = 1) -> bytes:
    locals_ = tuple(LocalEvent(origin or rogue_id, ROGUE_BOOT, first_seq + i, e) for i, e in enumerate(events))  # type: ignore[arg-type]
    return encode(LocalEventBatch(locals_, version=version))


def _edge_in(state: dict, source: str, sink: str) -> bool:
    return sink in state["edges"].get(source, {})


def test_junk_on_every_topic_and_stream_is_dropped_counted_and_harmless(tmp_path, models_dir):
    rng = random.Random(6)
    cluster = Cluster(tmp_path, 2, extra_args=["--models-dir", str(models_dir)])
    rogue = None
    try:
        cluster.start()
        nodes = cluster.nodes
        ids = [self_id(n) for n in nodes]
        master_id = state_of(nodes[0])["master"]
        master = nodes[ids.index(master_id)]
        follower_id = next(i for i in ids if i != master_id)
        view = master.place_and_wait(MODEL, timeout=120)
        iid = view["instance_id"]
        rogue = _start_rogue(tmp_path, nodes)
        rid = rogue.node_id
        before = wait_until(lambda: agreement(nodes, 2), 30, what="agreement after the rogue joined")
        state0 = state_of(master)
        base = [_counters(n) for n in nodes]

        # 1. gossip: junk on every topic, wrong versions, forged senders, out-of-range indices
        junk = _junk_payloads(rng)
        hb = Heartbeat(rid, ROGUE_BOOT, 0, None, 0, 0, 0)
        fake_indexed = [
            IndexedEvent(state0["term"], state0["last_event_idx"] + 1, InstanceDeleted(iid)),  # next index, not from the master
            IndexedEvent(state0["term"] + 5, 2**62, NodeTimedOut(follower_id)),  # far out of range
            IndexedEvent(state0["term"], -3, NodeTimedOut(follower_id)),  # negative index
            IndexedEvent(state0["term"], 1, MasterElected(rid, 2**40)),  # an index every node has
        ]
        messages = []
        for payload in junk:
            messages += [(HEARTBEATS_TOPIC, payload), (LOCAL_EVENTS_TOPIC, payload), (GLOBAL_EVENTS_TOPIC, payload)]
        messages += [
            (HEARTBEATS_TOPIC, encode(msgspec.structs.replace(hb, version=99))),
            (HEARTBEATS_TOPIC, encode(msgspec.structs.replace(hb, node_id=follower_id))),  # forged sender
            (LOCAL_EVENTS_TOPIC, _local_batch(rid, [InstanceDeleted(iid)], version=99)),
            (LOCAL_EVENTS_TOPIC, _local_batch(rid, [InstanceDeleted(iid)], origin=follower_id)),  # forged origin
            (GLOBAL_EVENTS_TOPIC, encode(msgspec.structs.replace(fake_indexed[0], version=99))),
        ]
        messages += [(GLOBAL_EVENTS_TOPIC, encode(e)) for e in fake_indexed for _ in range(2)]  # each twice
        big = rng.randbytes(900 * 1024)  # oversized for gossip (limit 512 KiB), below libp2p's 1 MiB RPC cap
        messages += [(HEARTBEATS_TOPIC, big), (LOCAL_EVENTS_TOPIC, big), (GLOBAL_EVENTS_TOPIC, big)]
        for topic, data in messages:
            assert rogue.publish(topic, data)["ok"]
            time.sleep(0.01)

        def counted(node, kinds):
            c = _counters(node)
            return all(c.get(k, 0) >= 1 for k in kinds)

        everywhere = [
            "heartbeat_undecodable", "heartbeat_version", "heartbeat_forged",
            "global_event_undecodable", "global_event_version", "global_event_not_from_master",
        ]
        on_master = ["local_event_undecodable", "local_event_version", "local_event_forged"]
        for n in nodes:
            wait_until(lambda: counted(n, everywhere + (on_master if n is master else [])), 20, what=f"drops counted on {n.url}: {_counters(n)}")

        # a duplicated local event (re-sent like a real node does) is indexed once
        edge_batch = _local_batch(rid, [TopologyEdgeCreated(TopologyEdge(rid, master_id, "127.0.0.1"))])
        for _ in range(4):
            assert rogue.publish(LOCAL_EVENTS_TOPIC, edge_batch)["ok"]
            time.sleep(0.3)
        wait_until(lambda: _edge_in(state_of(master), rid, master_id), 15, what="the rogue's own edge event applied")
        wait_until(lambda: _counters(master).get("local_event_duplicate", 0) > base[ids.index(master_id)].get("local_event_duplicate", 0), 10, what="duplicates counted")

        # 2. streams: junk frames, frames announcing 4 GiB, silent streams, half frames
        ops = []
        for peer in ids:
            for proto in (COMMAND_PROTOCOL, LOG_PROTOCOL, CHUNKS_PROTOCOL):
                ops.append({"op": "request", "peer": peer, "protocol": proto, "hex": rng.randbytes(64).hex(), "timeout": 10})
                ops.append({"op": "raw_stream", "peer": peer, "protocol": proto, "hex": "ffffffff", "hold": 3})
                ops.append({"op": "raw_stream", "peer": peer, "protocol": proto, "hex": "", "hold": 14})  # never sends
                ops.append({"op": "raw_stream", "peer": peer, "protocol": proto, "hex": "00000064" + "ab" * 10, "hold": 14})
            ops.append({"op": "request", "peer": peer, "protocol": COMMAND_PROTOCOL, "timeout": 10,
                        "hex": encode(CommandEnvelope(rid, PlaceInstance("c1", MODEL), version=99)).hex()})  # type: ignore[arg-type]
            ops.append({"op": "request", "peer": peer, "protocol": "/exo-p2p/unknown/1", "hex": "00", "timeout": 5})
        results = rogue.call("batch", ops=ops, timeout=60)["results"]
        for op, res in zip(ops, results):
            assert res.get("ok") is not None, (op, res)
            if op["op"] == "request":
                assert res["ok"] is False, (op["protocol"], res)  # junk gets an error reply, never a hang
            elif op["hex"] == "":
                assert res["ended"] in ("reset", "eof") and res["after_s"] <= 13, res  # dropped after ~10 s

        # log requests with hostile numbers get a sane answer (events or a snapshot), no crash
        for req in (LogRequest(from_idx=-5, max_events=-1), LogRequest(from_idx=2**62, prev_idx=2**62, prev_term=-1), LogRequest(from_idx=1, max_events=2**40)):
            res = rogue.request(master_id, LOG_PROTOCOL, encode(req))
            assert res["ok"], res
            msgspec.msgpack.decode(bytes.fromhex(res["reply_hex"]), type=LogResponse)
        # a chunk batch for a task nobody has is dropped (counted as undeliverable)
        res = rogue.request(follower_id, CHUNKS_PROTOCOL, encode(ChunkBatch((TokenChunk("no-such-task", "x", 1),))))  # type: ignore[arg-type]
        assert res["ok"]

        for n in nodes:
            c = _counters(n)
            for kind in ("request_handler_error", "request_too_large", "request_idle_dropped"):
                assert c.get(kind, 0) >= 1, (n.url, kind, c)
            assert c.get("chunks_undeliverable", 0) >= (1 if n is nodes[ids.index(follower_id)] else 0)

        # 3. nothing crashed, nothing forged was applied, one State everywhere
        for n in nodes:
            assert n.proc.poll() is None, n.log_tail()
        after = wait_until(lambda: agreement(nodes, 2), 30, what="agreement after the attack")
        assert after[0] == before[0] and after[1] == before[1]  # same master, same term
        s = state_of(master)
        assert iid in s["instances"] and s["instances"][iid]["failed_reason"] is None
        assert set(s["nodes"]) == set(ids) and s["master"] == master_id
        assert s["term"] < 2**40

        # 4. the cluster still serves: a chat on the instance, and a new placement
        r = nodes[ids.index(follower_id)].chat("hello", MODEL, max_tokens=5, temperature=0)
        assert r.status_code == 200, r.text
        assert httpx.delete(master.url + f"/instances/{iid}", timeout=30).status_code == 200
        master.place_and_wait(MODEL, timeout=120, min_nodes=2)
        r = master.chat("hello", MODEL, max_tokens=5, temperature=0)
        assert r.status_code == 200, r.text
        for n in nodes:
            assert n.proc.poll() is None, n.log_tail()
    finally:
        if rogue is not None:
            rogue.stop()
        cluster.stop()


def test_forged_local_events_about_others_are_never_applied(tmp_path, models_dir):
    """The rogue sends, as itself and in sequence, events only the master may make or that
    describe another node: none may be applied. A legitimate event of its own first proves
    its messages reach the master."""
    node = NodeProcess(tmp_path / "n", extra_args=["--models-dir", str(models_dir)])
    rogue = None
    try:
        node.start()
        mid = self_id(node)
        view = node.place_and_wait(MODEL, timeout=120)
        iid = view["instance_id"]
        runner_id = view["shards"][0]["runner_id"]
        rogue = _start_rogue(tmp_path, [node])
        rid = rogue.node_id
        s0 = state_of(node)
        profile = dict(s0["nodes"][mid])
        control = _local_batch(rid, [TopologyEdgeCreated(TopologyEdge(rid, mid, "127.0.0.1"))])  # its own: allowed
        for _ in range(3):
            assert rogue.publish(LOCAL_EVENTS_TOPIC, control)["ok"]
            time.sleep(0.3)
        wait_until(lambda: _edge_in(state_of(node), rid, mid), 15, what="the rogue's own event applied (delivery works)")
        forged = [
            RunnerStatusUpdated(runner_id, iid, mid, RunnerFailed("forged by a peer")),  # another node's runner
            NodeProfileUpdated(msgspec.convert({**profile, "friendly_name": "forged", "memory_total": 1}, type=NodeProfile)),
            MasterElected(rid, 2**40),  # master-only
            NodeTimedOut(mid),  # master-only
            InstanceDeleted(iid),  # master-only (a member deletes by command)
            TopologyEdgeCreated(TopologyEdge(rid, "control-sink", "127.0.0.1")),  # its own, last: proves the batch arrived
        ]
        batch = _local_batch(rid, forged, first_seq=2)
        for _ in range(3):
            assert rogue.publish(LOCAL_EVENTS_TOPIC, batch)["ok"]
            time.sleep(0.5)
        wait_until(lambda: _edge_in(state_of(node), rid, "control-sink"), 15, what="the forged batch delivered")
        time.sleep(1.0)
        s = state_of(node)
        problems = []
        if s["master"] != mid or s["term"] >= 2**40:
            problems.append(f"master/term forged: {s['master']} {s['term']}")
        if mid not in s["nodes"]:
            problems.append("the master was timed out by a forged NodeTimedOut")
        elif s["nodes"][mid]["friendly_name"] == "forged":
            problems.append("another node's profile was overwritten")
        if iid not in s["instances"]:
            problems.append("the instance was deleted by a forged local event")
        elif s["instances"][iid]["failed_reason"]:
            problems.append(f"the instance failed: {s['instances'][iid]['failed_reason']}")
        assert not problems, problems
        r = node.chat("hello", MODEL, max_tokens=5, temperature=0)
        assert r.status_code == 200, r.text
        assert node.proc.poll() is None
    finally:
        if rogue is not None:
            rogue.stop()
        node.stop()


def test_chunks_from_a_peer_not_serving_the_task_never_reach_the_client(tmp_path, models_dir):
    node = NodeProcess(tmp_path / "n", extra_args=["--models-dir", str(models_dir)])
    rogue = None
    try:
        node.start()
        mid = self_id(node)
        node.place_and_wait(MODEL, timeout=120)
        rogue = _start_rogue(tmp_path, [node])
        lines: list[str] = []
        done = threading.Event()

        def stream() -> None:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "max_tokens": 400, "stream": True, "temperature": 0}
            try:
                with httpx.stream("POST", node.url + "/v1/chat/completions", json=body, timeout=120) as r:
                    for line in r.iter_lines():
                        if line:
                            lines.append(line)
            except httpx.HTTPError as exc:
                lines.append(f"transport error {exc!r}")
            done.set()

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        task_id = wait_until(lambda: next(iter(state_of(node)["tasks"]), None), 30, interval=0.05, what="task in State")
        batch = ChunkBatch((TokenChunk(task_id, "INJECTED", 1), FinishChunk(task_id, "stop", 1, 1)))  # type: ignore[arg-type]
        res = rogue.request(mid, CHUNKS_PROTOCOL, encode(batch))
        assert res["ok"] or "RemoteError" in res.get("error", ""), res
        assert done.wait(120), "stream did not end"
        text = "\n".join(lines)
        assert "INJECTED" not in text, "a peer wrote into another client's stream"
        assert node.proc.poll() is None
    finally:
        if rogue is not None:
            rogue.stop()
        node.stop()
