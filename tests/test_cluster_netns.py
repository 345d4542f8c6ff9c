"""Clusters on a LAN made of network namespaces (root; docs/architecture.md#testing): partition and
heal, zero configuration, one master per cluster (docs/cluster.md).

Each node runs in its own namespace (``ip netns exec``) with one veth on a Linux bridge; the
test reaches the APIs from the host over a bridge. Names and subnets are unique per test and
everything (processes, namespaces, bridges) is removed in ``finally``.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from tests.conftest import tiny_models_dir
from tests.support.cluster import NetnsLan, NetnsNodeProcess, agreement, nodes_cleanup, self_id, start_all, state_of, wait_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"),
]


MODEL = "tiny"


def unique_cluster(tag: str) -> str:
    return f"{tag}-{os.getpid()}-{time.monotonic_ns() % 10**9}"


def test_zero_config_three_nodes_find_each_other_by_mdns(tmp_path):
    """No discovery flags at all: 3 nodes in 3 namespaces form one cluster by mDNS within
    10 s of the last node's API answering."""
    name = unique_cluster("zc")
    nodes: list[NetnsNodeProcess] = []
    with NetnsLan(3, multicast=True) as lan, nodes_cleanup(nodes):
        for i in range(3):
            nodes.append(NetnsNodeProcess(tmp_path / f"n{i}", netns=lan.namespaces[i], listen_host=lan.lan_ip(i), cluster=name, mdns=True))
        t_spawn = time.monotonic()
        last_up = start_all(nodes)
        formed = wait_until(lambda: agreement(nodes, 3), 10, interval=0.1, what="mDNS cluster of 3")
        took = time.monotonic() - last_up
        print(f"zero-config: one cluster of 3 {took:.2f} s after the last API answered, {time.monotonic() - t_spawn:.1f} s after spawning (master {formed[0][:12]})")
        ids = {self_id(n) for n in nodes}
        assert formed[0] in ids
        # every node lists all three, reachable at its LAN address, exactly one master
        for n in nodes:
            listing = n.get("/nodes").json()
            assert {e["node_id"] for e in listing} == ids
            assert sum(e["is_master"] for e in listing) == 1
            assert all(any(a.startswith(f"/ip4/{lan.subnet}.") for a in e["addrs"]) for e in listing), listing
            assert not any("no peers" in w for w in state_of(n)["warnings"])


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tiny_models_dir(tmp_path_factory, n_layers=2, seed=4)


def test_partition_then_heal_keeps_the_majoritys_work(tmp_path, models_dir):
    """3 nodes split 1|2 by taking a follower's link down: the lone node claims mastership
    alone at a higher term, while the pair's master keeps going and places an instance.
    After the link comes back the cluster has one master, the pair's (the side that kept the
    cluster going wins: more live nodes, then more committed events, then the term: the heal
    rule, ``election.master_rank``), and one log: the pair's events are kept (same or higher last index, the
    instance placed during the partition still ready), the lone node's are dropped. Under the
    old (term, priority, node id) rule the lone node won and the instance was deleted."""
    name = unique_cluster("ph")
    nodes: list[NetnsNodeProcess] = []
    with NetnsLan(3, multicast=False, mgmt=True) as lan, nodes_cleanup(nodes):
        def node(i: int, extra: list[str]) -> NetnsNodeProcess:
            return NetnsNodeProcess(
                tmp_path / f"n{i}", netns=lan.namespaces[i], listen_host=lan.lan_ip(i), api_host=lan.mgmt_ip(i), cluster=name,
                extra_args=["--models-dir", str(models_dir), *extra],
            )

        first = node(0, [])
        nodes.append(first)
        first.start()
        boot = first.addrs()[0]
        for i in (1, 2):
            nodes.append(node(i, ["--bootstrap", boot]))
        start_all(nodes[1:])
        master_id, term0, _, _ = wait_until(lambda: agreement(nodes, 3), 30, what="cluster of 3")
        ids = [self_id(n) for n in nodes]
        lone_i = next(i for i in range(3) if ids[i] != master_id)  # isolate a follower
        pair = [nodes[i] for i in range(3) if i != lone_i]
        lone = nodes[lone_i]

        lan.cut(lone_i)
        t_cut = time.monotonic()

        def split():
            lone_s, pair_a = state_of(lone), agreement(pair)
            if lone_s is None or pair_a is None:
                return None
            if lone_s["master"] == ids[lone_i] and pair_a[0] != ids[lone_i]:
                return lone_s, pair_a
            return None

        lone_s, pair_a = wait_until(split, 30, what="a master on each side of the partition")
        print(f"partition: both sides have a master after {time.monotonic() - t_cut:.1f} s")
        # the pair's side keeps working: it places an instance on one of its nodes
        host = pair[1] if self_id(pair[0]) == pair_a[0] else pair[0]
        r = pair[0].post("/instances", json={"model": MODEL, "nodes": [self_id(host)]}, timeout=60)
        assert r.status_code == 201, r.text
        instance_id = r.json()["instance_id"]
        wait_until(lambda: pair[0].get(f"/instances/{instance_id}").json()["status"] == "ready", 90, what="instance ready on the pair side")
        # let both sides sequence a little more (timeouts, topology) so the logs diverge
        time.sleep(2)
        lone_s = state_of(lone)
        pair_a = wait_until(lambda: agreement(pair), 10, what="the pair agrees")
        pair_master, pair_term, pair_idx, _ = pair_a
        assert lone_s["master"] == ids[lone_i] and pair_master != ids[lone_i]
        assert lone_s["term"] > pair_term, "the lone node claimed a higher term (else the old rule would pass too)"
        assert instance_id not in lone_s["instances"]

        lan.heal(lone_i)
        t_heal = time.monotonic()
        final = wait_until(lambda: agreement(nodes, 3), 60, interval=0.25, what="one master and one log after heal")
        print(f"heal: one master ({'lone side' if final[0] == ids[lone_i] else 'pair side'}) and one log after {time.monotonic() - t_heal:.1f} s")
        assert final[0] == pair_master, (final, pair_a, lone_s["term"])
        assert final[1] == pair_term  # the majority's term: nobody re-elected
        assert final[2] >= pair_idx  # no committed event of the majority was dropped
        for n in nodes:
            s = state_of(n)
            assert instance_id in s["instances"], "the instance placed during the partition was lost"
            assert sum(e["is_master"] for e in n.get("/nodes").json()) == 1
        assert pair[0].get(f"/instances/{instance_id}").json()["status"] == "ready"
