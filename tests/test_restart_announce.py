"""Real node processes on 127.0.0.1 (docs/cli.md "The node"): a node restarted with its data
dir says it re-places its instance from before, and ``place`` refuses to add a second one
beside it (the instance is not doubled); a node says which cluster it joined or started,
the open-cluster note once; a node whose peer left says when it left. The tiny synthetic
model keeps it quick."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.cluster import NodeProcess, converged, nodes_cleanup, wait_until
from tests.conftest import TINY_MODEL

pytestmark = pytest.mark.integration
MODEL = TINY_MODEL


def invoke(args: list[str]):
    """The CLI in-process (no terminal: ``place`` refuses where it would ask)."""
    from typer.testing import CliRunner

    from exo_p2p.cli.main import app

    return CliRunner().invoke(app, args, env={"EXO_P2P_API": None, "COLUMNS": "200"}, catch_exceptions=False)


def records_since(node: NodeProcess, offset: int, event: str) -> list[dict]:
    """The JSON log records named ``event`` the node wrote after byte ``offset`` of its log."""
    with open(node.log_path, "rb") as f:
        f.seek(offset)
        lines = f.read().decode(errors="replace").splitlines()
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == event:
            out.append(record)
    return out


def instances_of(node: NodeProcess, model: str) -> list[dict]:
    return [i for i in node.get("/instances").json() if i["model"] == model]


def test_a_restarted_node_re_places_its_instance_and_place_does_not_double_it(tmp_path, models_dir):
    """Restarted with its data dir, the node says "re-placing 1 instance from before: tiny on
    a; ..." and `place` refuses (no terminal) instead of adding a second instance: one
    instance, one runner. Restarted again with its memory capped (the re-placement fits
    nowhere for now, so the instance stays failed, awaiting re-placement, for seconds), that
    failed instance counts too; `exo-p2p stop tiny` drops it."""
    node = NodeProcess(tmp_path / "a", extra_args=["--name", "a", "--models-dir", str(models_dir)])
    with nodes_cleanup([node]):
        node.start()
        node.place_and_wait(MODEL, timeout=180)
        node.stop()

        mark = node.log_path.stat().st_size
        node.start()
        (said,) = wait_until(lambda: records_since(node, mark, "instances from before"), 30, what="the banner's line")
        assert said["detail"] == f"re-placing 1 instance from before: {MODEL} on a; `exo-p2p stop {MODEL}` to drop it"
        result = invoke(["place", MODEL, "--no-wait", "--api", node.url])
        assert result.exit_code == 0, result.output
        assert f"{MODEL} already has 1 instance" in result.stderr and "not placing another" in result.stderr, result.stderr
        wait_until(lambda: [i for i in instances_of(node, MODEL) if i["status"] == "ready"], 180, what="re-placed and ready")
        time.sleep(2.0)  # a second placement would show by now
        assert len(instances_of(node, MODEL)) == 1
        assert len(node.children()) == 1, node.children()
        node.stop()

        node.extra_args += ["--fault-hook", "free_memory=1000"]
        node.start()
        state = node.get("/state").json()
        (record,) = [i for i in state["instances"].values() if i["model_id"] == MODEL]
        assert record["failed_reason"] and not record["gave_up"], record  # awaiting re-placement
        result = invoke(["place", MODEL, "--no-wait", "--api", node.url])
        assert result.exit_code == 0, result.output
        assert "already has 1 instance" in result.stderr and "being re-placed" in result.stderr, result.stderr
        assert "--replica adds a replica" in result.stderr and "the master re-places it" in result.stderr
        result = invoke(["stop", MODEL, "--api", node.url])
        assert result.exit_code == 0, result.output
        wait_until(lambda: not instances_of(node, MODEL), 10, what="instance dropped")


def test_a_node_says_which_cluster_it_joined_and_when_its_last_peer_left(tmp_path):
    """The first node "started a new cluster NAME"; the second, console format, prints
    "joined cluster NAME: 2 nodes, master one" in its banner and the open-cluster note once.
    Once the second stops, the first warns "the last peer left N s ago"."""
    one = NodeProcess(tmp_path / "one", extra_args=["--name", "one"])
    nodes = [one]
    with nodes_cleanup(nodes):
        one.start()
        two = NodeProcess(tmp_path / "two", cluster=one.cluster,
                          extra_args=["--name", "two", "--bootstrap", one.addrs()[0], "--log-format", "console"])  # fmt: skip
        nodes.append(two)
        two.start()
        wait_until(lambda: converged([one, two], 2), 60, what="2-node cluster")
        (started,) = records_since(one, 0, "cluster membership")
        assert started["detail"] == f"started a new cluster {one.cluster}" and started["nodes"] == 1
        assert len(records_since(one, 0, "open cluster")) == 1
        banner = wait_until(lambda: "  api: " in two.log_tail(200) and two.log_tail(200), 10, what="the banner")
        assert f"  joined cluster {one.cluster}: 2 nodes, master one\n" in banner, banner
        assert banner.count("the cluster is open") == 1, banner
        assert "no peers" not in " ".join(one.get("/state").json()["warnings"])
        two.stop()
        warned = wait_until(lambda: [w for w in one.get("/state").json()["warnings"] if w.startswith("no peers")], 40,
                            what="the no-peers warning")  # fmt: skip
        assert "the last peer left" in warned[0] and "no peers found" not in warned[0], warned
