"""Cluster separation and private clusters with real node processes on 127.0.0.1
(docs/cluster.md: one master per cluster).

Two clusters share one cluster *name* and differ only in their ``--cluster-secret`` (made by
``exo-p2p cluster-secret FILE``), so only the PSK keeps them apart; a node of one cluster is
even given a bootstrap address of the other. A node with no secret bootstrapping to a member
is refused: it stays alone and nothing it says reaches any member's State.
"""

from __future__ import annotations

import time

import pytest

from tests.support.cluster import NodeProcess, agreement, make_secret, nodes_cleanup, self_id, state_of, wait_until

pytestmark = pytest.mark.integration


def listed_ids(node: NodeProcess) -> set[str]:
    return {n["node_id"] for n in node.get("/nodes", timeout=5).json()}


def mentions(state: dict, node_id: str) -> bool:
    """Whether ``node_id`` appears anywhere in a member's replicated State document."""
    replicated = {k: v for k, v in state.items() if k not in ("node_id", "master", "warnings", "counters")}
    return node_id in repr(replicated)


def test_two_private_clusters_stay_apart_and_an_outsider_is_refused(tmp_path):
    name = f"sec-{time.monotonic_ns() % 10**9}"
    secret_a = make_secret(tmp_path / "a.secret")
    secret_b = make_secret(tmp_path / "b.secret")
    assert secret_a.read_text() != secret_b.read_text()
    nodes: list[NodeProcess] = []
    with nodes_cleanup(nodes):
        a1 = NodeProcess(tmp_path / "a1", cluster=name, extra_args=["--cluster-secret", str(secret_a)])
        nodes.append(a1)
        a1.start()
        b1 = NodeProcess(tmp_path / "b1", cluster=name, extra_args=["--cluster-secret", str(secret_b)])
        nodes.append(b1)
        b1.start()
        a_boot, b_boot = a1.addrs()[0], b1.addrs()[0]
        # a2 is told about both clusters' first nodes; b2 too: only the PSK separates them
        a2 = NodeProcess(tmp_path / "a2", cluster=name, extra_args=["--cluster-secret", str(secret_a), "--bootstrap", a_boot, "--bootstrap", b_boot])
        b2 = NodeProcess(tmp_path / "b2", cluster=name, extra_args=["--cluster-secret", str(secret_b), "--bootstrap", b_boot, "--bootstrap", a_boot])
        nodes += [a2, b2]
        a2.start()
        b2.start()
        ids_a = {self_id(a1), self_id(a2)}
        ids_b = {self_id(b1), self_id(b2)}

        def both_formed():
            return agreement([a1, a2], 2) and agreement([b1, b2], 2)

        # while forming, no node ever lists a node of the other cluster
        deadline = time.monotonic() + 30
        formed = False
        while time.monotonic() < deadline and not formed:
            for n in (a1, a2):
                assert not listed_ids(n) & ids_b, "a node of cluster A lists a node of cluster B"
            for n in (b1, b2):
                assert not listed_ids(n) & ids_a, "a node of cluster B lists a node of cluster A"
            formed = bool(both_formed())
            time.sleep(0.2)
        assert formed, f"clusters did not form:\n{a2.log_tail()}\n{b2.log_tail()}"
        assert wait_until(lambda: agreement([a1, a2]), 10, what="A agrees")[0] in ids_a
        assert wait_until(lambda: agreement([b1, b2]), 10, what="B agrees")[0] in ids_b

        # an outsider with no secret, bootstrapping to a member, is refused within 10 s
        outsider = NodeProcess(tmp_path / "out", cluster=name, extra_args=["--bootstrap", a_boot])
        nodes.append(outsider)
        outsider.start()
        t0 = time.monotonic()  # from its API answering: a slow start on a busy machine is not the refusal
        out_id = self_id(outsider)
        wait_until(lambda: state_of(outsider)["counters"].get("redial_failed", 0) >= 1, 10 - (time.monotonic() - t0) + 1, what="outsider's dial refused")
        refused_after = time.monotonic() - t0
        assert refused_after <= 11, f"refusal took {refused_after:.1f} s"
        # keep watching for a while: it stays alone and nothing of it is applied anywhere
        for _ in range(20):
            out_state = state_of(outsider)
            assert set(out_state["nodes"]) <= {out_id}, out_state["nodes"].keys()
            assert listed_ids(outsider) == {out_id}
            for member in (a1, a2, b1, b2):
                s = state_of(member)
                assert not mentions(s, out_id), f"outsider's events reached {member.url}"
                assert out_id not in listed_ids(member)
            time.sleep(0.25)
        # the members are unaffected: still one cluster each, same master
        wait_until(lambda: agreement([a1, a2], 2) and agreement([b1, b2], 2), 10, what="both clusters unaffected")
        assert a1.proc.poll() is None and a2.proc.poll() is None
