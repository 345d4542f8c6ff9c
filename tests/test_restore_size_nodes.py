"""A 2-node instance shrinks when a node dies and comes back to size when it returns
(``master.restore``; docs/cluster.md), with real node processes and the tiny model."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.cluster import NodeProcess, nodes_cleanup, self_id, state_of, wait_until

pytestmark = pytest.mark.integration
MODEL = "tiny"


def _ps(node: NodeProcess) -> str:
    """``exo-p2p ps`` against ``node``, wide enough that no cell wraps."""
    env = {**os.environ, "COLUMNS": "250"}
    env.pop("EXO_P2P_API", None)
    proc = subprocess.run([sys.executable, "-m", "exo_p2p", "ps", "--api", node.url],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _instances(node: NodeProcess) -> list[dict]:
    """The instances of ``node``'s State (with ``placed``), each with its status from ``/instances``."""
    state = state_of(node) or {}
    status = {v["instance_id"]: v["status"] for v in node.get("/instances").json()}
    return [{**inst, "status": status.get(iid)} for iid, inst in (state.get("instances") or {}).items()]


def test_a_shrunk_instance_says_so_and_comes_back_to_two_ranks_when_its_node_returns(tmp_path, models_dir):
    common = ["--models-dir", str(models_dir), "--max-moves", "0"]
    with nodes_cleanup([]) as nodes:
        a = NodeProcess(tmp_path / "a", extra_args=[*common, "--name", "node-a", "--priority", "10"])
        nodes.append(a.start())
        b = NodeProcess(tmp_path / "b", cluster=a.cluster, extra_args=[*common, "--name", "node-b",
                                                                      *(x for addr in a.addrs() for x in ("--bootstrap", addr))])
        nodes.append(b.start())
        a_id = self_id(a)
        wait_until(lambda: len(a.get("/nodes").json()) == 2 and (state_of(a) or {}).get("master") == a_id, 60,
                   what="two nodes, node-a master")
        placed = a.place_and_wait(MODEL, min_nodes=2)
        assert len(placed["shards"]) == 2

        b.kill()  # SIGKILL of node-b's process; its runner exits by itself

        def shrunk() -> dict | None:
            for inst in _instances(a):
                if inst["status"] == "ready" and len(inst["shards"]) == 1 and len(inst.get("placed") or []) == 2:
                    return inst
            return None

        small = wait_until(shrunk, 90, what="the instance re-placed on node-a alone")
        assert sorted(p["name"] for p in small["placed"]) == ["node-a", "node-b"], small["placed"]
        assert "shrunk from 2 ranks (node node-b left)" in _ps(a)

        b.start()  # the same data dir: the same node id, a new boot

        def restored() -> dict | None:
            listed = _instances(a)
            if len(listed) == 1 and listed[0]["status"] == "ready" and len(listed[0]["shards"]) == 2:
                return listed[0]
            return None

        back = wait_until(restored, 120, what="the instance at 2 ranks again, the shrunk one gone")
        assert back["restores"] and back["replaces"] == small["instance_id"], back
        assert "shrunk" not in _ps(a)
        r = a.chat("hello", MODEL, max_tokens=5, temperature=0)
        assert r.status_code == 200, r.text
