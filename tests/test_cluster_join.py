"""Joining a closed cluster in two commands, with real node processes on 127.0.0.1
(docs/cluster.md): ``exo-p2p invite`` on a member prints a join token; ``exo-p2p node --join TOKEN``
on a new machine keeps the secret in its data dir and joins; a restart needs no flag. An open
node says at start that the cluster is open, and ``invite`` there says how to close it.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.support.cluster import REPO, NodeProcess, agreement, make_secret, nodes_cleanup, self_id, wait_until

pytestmark = pytest.mark.integration


def invite(node: NodeProcess) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "exo_p2p", "invite", "--api", node.url, "--data-dir", str(node.data_dir)],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip


def test_invite_then_join_then_restart_without_flags(tmp_path):
    name = f"join-{time.monotonic_ns() % 10**9}"
    secret = make_secret(tmp_path / "lab.secret")
    nodes: list[NodeProcess] = []
    with nodes_cleanup(nodes):
        member = NodeProcess(tmp_path / "a", cluster=name, extra_args=["--cluster-secret", str(secret)])
        nodes.append(member)
        member.start()
        r = invite(member)
        assert r.returncode == 0, r.stderr
        token = r.stdout.strip()
        assert token.startswith("exo1_") and "\n" not in token and len(token) < 400, token
        newcomer = NodeProcess(tmp_path / "b", cluster=name, extra_args=["--join", token])
        nodes.append(newcomer)
        newcomer.start()
        wait_until(lambda: agreement(nodes, 2), 30, what="the newcomer joined")
        assert (tmp_path / "b" / "cluster.secret").read_bytes().strip() == secret.read_bytes().strip()
        assert '"event": "closed cluster"' in newcomer.log_tail(200) and "the cluster is open" not in newcomer.log_tail(200)
        newcomer_id = self_id(newcomer)
        newcomer.stop()
        # restart with no flag at all: the kept secret, and the peers in its State, bring it back
        again = NodeProcess(tmp_path / "b", cluster=name)
        nodes.append(again)
        t0 = time.monotonic()
        again.start()
        wait_until(lambda: agreement([member, again], 2), 30, what="the restarted newcomer rejoined")
        print(f"restart without flags: rejoined {time.monotonic() - t0:.1f} s after start")
        assert self_id(again) == newcomer_id


def test_open_node_says_it_is_open_and_invite_says_how_to_close_it(tmp_path):
    nodes: list[NodeProcess] = []
    with nodes_cleanup(nodes):
        node = NodeProcess(tmp_path / "o")
        nodes.append(node)
        node.start()
        wait_until(lambda: "the cluster is open" in node.log_tail(200), 10, what="the open-cluster notice")
        r = invite(node)
        assert r.returncode == 1
        assert "open" in r.stderr and "exo-p2p cluster-secret FILE" in r.stderr and "--cluster-secret" in r.stderr
        assert r.stdout == ""
