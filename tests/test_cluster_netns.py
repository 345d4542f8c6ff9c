"""Clusters on a LAN made of network namespaces (root; design.md §8; issue 3 "Partition and
heal", "Zero configuration"; field case B18).

Each node runs in its own namespace (``ip netns exec``) with one veth on a Linux bridge; the
test reaches the APIs from the host over a bridge. Names and subnets are unique per test and
everything (processes, namespaces, bridges) is removed in ``finally``.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from tests.cluster import NetnsLan, NetnsNodeProcess, agreement, nodes_cleanup, self_id, start_all, state_of, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"),
]


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


def test_partition_then_heal_converges_to_one_master_and_one_log(tmp_path):
    """3 nodes split 1|2 by taking a follower's link down: both sides have a master; after
    the link comes back the cluster has one master, the higher ``(term, priority, node id)``
    of the two (design.md §5a), and one log (same last index and State hash everywhere)."""
    name = unique_cluster("ph")
    nodes: list[NetnsNodeProcess] = []
    with NetnsLan(3, multicast=False, mgmt=True) as lan, nodes_cleanup(nodes):
        def node(i: int, extra: list[str]) -> NetnsNodeProcess:
            return NetnsNodeProcess(tmp_path / f"n{i}", netns=lan.namespaces[i], listen_host=lan.lan_ip(i), api_host=lan.mgmt_ip(i), cluster=name, extra_args=extra)

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
        # let both sides sequence a little (timeouts, topology) so the logs diverge
        time.sleep(3)
        lone_s, pair_s = state_of(lone), state_of(pair[0])
        assert lone_s["master"] == ids[lone_i] and pair_s["master"] == pair_a[0]
        candidates = [
            (lone_s["term"], 0, lone_s["master"]),
            (pair_s["term"], 0, pair_s["master"]),
        ]
        expected = max(candidates)[2]

        lan.heal(lone_i)
        t_heal = time.monotonic()
        final = wait_until(lambda: agreement(nodes, 3), 60, interval=0.25, what="one master and one log after heal")
        print(f"heal: one master ({'lone side' if final[0] == ids[lone_i] else 'pair side'}) and one log after {time.monotonic() - t_heal:.1f} s")
        assert final[0] == expected, (final, candidates)
        assert final[1] >= max(c[0] for c in candidates)
        assert final[1] > term0
        for n in nodes:
            assert sum(e["is_master"] for e in n.get("/nodes").json()) == 1
