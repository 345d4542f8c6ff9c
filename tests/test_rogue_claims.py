"""A rogue libp2p peer against a cluster (docs/cluster.md), real node processes on 127.0.0.1
and ``tests/support/net/rogue_peer.py`` (a host with its own identity that speaks the wire protocols).

- Open cluster (no secret): the rogue connects. Its forged master claim (term 10⁶, a huge
  log) is refused — it cannot answer for a log that extends the members' (``cluster.claims``)
  — so the master keeps its seat and term and a node joining meanwhile follows the real
  master; its commands are refused (it is not a node in State; ``cluster.command_access``);
  its indexed events are dropped (it is not the master followed).
- Closed cluster (``--cluster-secret``): the rogue cannot even connect; nothing it sends has
  any effect.
"""

from __future__ import annotations

import time

import msgspec
import pytest

from exo_p2p.cluster.messages import (
    COMMAND_PROTOCOL,
    GLOBAL_EVENTS_TOPIC,
    HEARTBEATS_TOPIC,
    Heartbeat,
    IndexedEventBatch,
    encode,
)
from exo_p2p.types import CommandEnvelope, CommandResult, DeleteInstance, IndexedEvent, NodeTimedOut
from tests.support.cluster import NodeProcess, agreement, make_secret, nodes_cleanup, self_id, state_of, wait_until
from tests.support.net.rogue_peer import RogueProcess

pytestmark = pytest.mark.integration

HUGE = 10**6


def forged_claim(rogue_id: str) -> bytes:
    return encode(Heartbeat(node_id=rogue_id, boot_id="rogue-boot", term=HUGE, master=rogue_id, priority=2**30,
                            last_idx=HUGE, last_term=HUGE, commit_idx=HUGE))  # fmt: skip


def forged_events(victim: str) -> bytes:
    return encode(IndexedEventBatch((IndexedEvent(idx=HUGE, term=HUGE, origin="rogue", origin_boot="x", origin_seq=1, event=NodeTimedOut(victim)),)))


def command(rogue: RogueProcess, master: str, origin: str) -> dict:
    envelope = CommandEnvelope(origin, DeleteInstance(command_id="rogue-cmd", instance_id="nope"))
    return rogue.request(master, COMMAND_PROTOCOL, encode(envelope), timeout=10)


def test_open_cluster_refuses_a_forged_master_claim_and_commands_from_a_non_member(tmp_path):
    name = f"rogue-{time.monotonic_ns() % 10**9}"
    nodes: list[NodeProcess] = []
    rogue = None
    with nodes_cleanup(nodes):
        try:
            first = NodeProcess(tmp_path / "a", cluster=name)
            nodes.append(first)
            first.start()
            s0 = wait_until(lambda: (s := state_of(first)) and s["master"] and s, 30, what="first node elected")
            first_id, term0 = self_id(first), s0["term"]
            rogue = RogueProcess(tmp_path / "rogue", [first.addrs()[0]], cluster=name, lifetime=120).start()
            wait_until(lambda: first_id in rogue.call("ping", timeout=10)["peers"], 15, what="rogue connected (open cluster)")
            time.sleep(1.5)  # gossip mesh formed
            second = None
            for k in range(16):  # 8 s of forged claims, one every 0.5 s
                assert rogue.publish(HEARTBEATS_TOPIC, forged_claim(rogue.node_id))["ok"]
                if k == 4:  # a node joining meanwhile follows the real master
                    second = NodeProcess(tmp_path / "b", cluster=name, extra_args=["--bootstrap", first.addrs()[0]])
                    nodes.append(second)
                    second.start()
                s = state_of(first)
                assert s["master"] == first_id and s["term"] == term0, "the master followed a forged claim"
                time.sleep(0.5)
            assert second is not None
            wait_until(lambda: agreement(nodes, 2), 30, what="the joining node follows the real master")
            assert wait_until(lambda: agreement(nodes, 2), 10, what="agreement")[:2] == (first_id, term0)
            assert state_of(first)["counters"].get("master_claim_refused", 0) >= 1
            assert state_of(second)["counters"].get("master_claim_refused", 0) >= 1
            # commands: a non-member (not a node in State) is refused, in its name or another's
            for origin in (rogue.node_id, self_id(second)):
                reply = command(rogue, first_id, origin)
                assert reply["ok"], reply
                result = msgspec.msgpack.decode(bytes.fromhex(reply["reply_hex"]), type=CommandResult)
                assert result.error is not None and result.error.code == "not_member" and result.error.status == 403, result
            # indexed events from a peer that is not the master: dropped
            before = state_of(second)
            assert rogue.publish(GLOBAL_EVENTS_TOPIC, forged_events(first_id))["ok"]
            time.sleep(1.5)
            after = state_of(second)
            assert first_id in after["nodes"] and after["last_event_idx"] < HUGE
            assert after["counters"].get("global_event_not_from_master", 0) >= before["counters"].get("global_event_not_from_master", 0)
            assert rogue.node_id not in after["nodes"]
        finally:
            if rogue is not None:
                rogue.stop()


def test_closed_cluster_gives_a_rogue_nothing(tmp_path):
    name = f"rogue-c-{time.monotonic_ns() % 10**9}"
    secret = make_secret(tmp_path / "s")
    nodes: list[NodeProcess] = []
    rogue = None
    with nodes_cleanup(nodes):
        try:
            first = NodeProcess(tmp_path / "a", cluster=name, extra_args=["--cluster-secret", str(secret)])
            nodes.append(first)
            first.start()
            s0 = wait_until(lambda: (s := state_of(first)) and s["master"] and s, 30, what="first node elected")
            first_id = self_id(first)
            rogue = RogueProcess(tmp_path / "rogue", [first.addrs()[0]], cluster=name, lifetime=120).start()
            assert rogue.call("ping", timeout=10)["peers"] == []
            for _ in range(4):
                rogue.publish(HEARTBEATS_TOPIC, forged_claim(rogue.node_id))
                rogue.publish(GLOBAL_EVENTS_TOPIC, forged_events(first_id))
            reply = command(rogue, first_id, rogue.node_id)
            assert not reply["ok"], reply  # no connection: the command never arrives
            s = state_of(first)
            assert (s["master"], s["term"]) == (first_id, s0["term"])
            assert rogue.node_id not in s["nodes"] and rogue.node_id not in repr(s)
            assert s["last_event_idx"] < HUGE
        finally:
            if rogue is not None:
                rogue.stop()
