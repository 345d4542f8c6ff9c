"""The CLI against real node processes (docs/cli.md): the README's two-node recipe run as a
script, JSON node logs that parse line by line and name their node, ``doctor`` on a 2-node
cluster and on a node that sees nobody (its peer refuses it: another cluster secret), and
the hint for an ``--api`` that points at a libp2p port. The tiny synthetic model keeps it
quick."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import tiny_models_dir
from tests.support.cluster import REPO, NodeProcess, converged, free_port, wait_until
from tests.support.cli_env import clean_env

pytestmark = pytest.mark.integration
MODEL = "tiny"


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tiny_models_dir(tmp_path_factory, n_layers=4, hidden_size=64, intermediate_size=128, seed=3)


def readme_two_node_recipe() -> str:
    """The shell block after "To try two nodes on one machine" in README.md."""
    text = (REPO / "README.md").read_text()
    after = text.index("To try two nodes on one machine")
    start = text.index("```sh\n", after) + len("```sh\n")
    return text[start : text.index("```", start)]


def json_records(path: Path) -> list[dict]:
    """Every line of a JSON log, parsed (fails the test on a line that is not JSON: C-level
    writes of a runner, such as MLX's "[ring] …" lines, are relayed as JSON by its
    supervisor, ``worker.runner_output``)."""
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            records.append(json.loads(line))
        except ValueError:
            pytest.fail(f"{path.name} line {number} is not JSON: {line!r}")
    return records


def test_readme_two_node_recipe_works_pasted_as_a_block(tmp_path, models_dir):
    """The recipe, run as one script right away (no sleeps), places
    the model on both nodes and answers; node logs stay out of the terminal, in files whose
    every line is JSON naming its node; routine messages are below info. Ports, data dirs
    and the model are the test's own (free ports, the tiny model, a private cluster name)."""
    script = readme_two_node_recipe()
    api_a, listen_a, api_b, listen_b = (free_port() for _ in range(4))
    for old, new in (
        ("52525", str(api_b)), ("52524", str(listen_b)), ("/tmp/node-b.log", str(tmp_path / "node-b.log")),
        ("/tmp/node-a.log", str(tmp_path / "node-a.log")), ("/tmp/node-b", str(tmp_path / "node-b")),
        ("smollm2-135m-instruct", MODEL), ("exo-p2p chat ", "exo-p2p chat --max-tokens 8 "),
    ):  # fmt: skip
        assert old in script, old
        script = script.replace(old, new)
    env = clean_env(
        # what the recipe leaves at the defaults: node a's ports and data dir, the client's URL
        EXO_P2P_HOME=str(tmp_path / "node-a"), EXO_P2P_API_PORT=str(api_a), EXO_P2P_LISTEN_PORT=str(listen_a),
        EXO_P2P_API=f"http://127.0.0.1:{api_a}",
        EXO_P2P_CLUSTER=f"recipe-{os.getpid()}", EXO_P2P_MODELS_DIR=str(models_dir), EXO_P2P_LOG_FORMAT="json",
    )  # fmt: skip
    (tmp_path / "recipe.sh").write_text("set -e\n" + script)
    proc = subprocess.Popen(
        ["bash", str(tmp_path / "recipe.sh")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, cwd=tmp_path, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the nodes, if the script did not stop them
        except ProcessLookupError:
            pass
    terminal = out + err
    assert proc.returncode == 0, terminal + "\n" + (tmp_path / "node-a.log").read_text()[-3000:]
    assert f"placed {MODEL} as instance" in out and "(pipeline, 2 nodes)" in out and "is ready" in out
    answer = out.split("is ready\n", 1)[1]
    assert answer.strip(), out
    # no node log line in the terminal
    assert '"event"' not in terminal and "node ready" not in terminal and "runner started" not in terminal
    # the logs: JSON, named, routine messages below info, both nodes run a rank
    for name in ("a", "b"):
        records = json_records(tmp_path / f"node-{name}.log")
        assert records and all(r.get("node") == name for r in records), name
        events = [r["event"] for r in records]
        assert "runner started" in events, (name, events)
        for r in records:
            assert not r["event"].startswith("message dropped") or r["kind"] not in ("global_event_not_from_master", "gossip_duplicate"), r
            if r["event"] == "runner task ended":
                assert r["completion_tokens"] is not None or r["level"] == "debug", r
    wait_until(lambda: not _pids_with(str(tmp_path)), 20, what="both nodes stopped by `kill %1 %2`")


def _pids_with(text: str) -> list[int]:
    import psutil

    return [p.pid for p in psutil.process_iter(["cmdline"]) if text in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid()]


def _doctor(node: NodeProcess, *extra: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "exo_p2p", "doctor", "--api", node.url, *extra],
        capture_output=True, text=True, env={**clean_env(), "COLUMNS": "400"}, timeout=60,
    )  # fmt: skip  (400 columns: one line per finding; folding is test_cli_first_hour's)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_doctor_on_a_two_node_cluster_and_on_a_node_that_sees_nobody(tmp_path):
    """``doctor``: on a member of a 2-node cluster it lists the peer as reachable; on a
    node whose bootstrap peer refuses it (another cluster secret) it says refused, that it
    sees nobody and the firewall hint. Every node log line is JSON (libp2p's included)."""
    cluster = f"doctor-{os.getpid()}"
    one = NodeProcess(tmp_path / "one", cluster=cluster, extra_args=["--name", "one"])
    nodes = [one]
    try:
        one.start()
        boot = one.addrs()[0]
        two = NodeProcess(tmp_path / "two", cluster=cluster, extra_args=["--name", "two", "--bootstrap", boot])
        secret = tmp_path / "secret"
        secret.write_text("ab" * 32)
        loner = NodeProcess(tmp_path / "loner", cluster=cluster,
                            extra_args=["--name", "loner", "--bootstrap", boot, "--cluster-secret", str(secret)])  # fmt: skip
        nodes += [two, loner]
        two.start()
        loner.start()
        wait_until(lambda: converged([one, two], 2), 60, what="2-node cluster")
        wait_until(lambda: any(w.startswith("bootstrap peer unreachable") for w in loner.get("/state").json()["warnings"]),
                   60, what="the loner's bootstrap dial fails")  # fmt: skip

        report = _doctor(one, "--mdns-seconds", "1")
        assert report.startswith("this node: one (")
        assert f"libp2p TCP port: {boot.split('/')[4]}" in report
        assert "peers known: 1" in report and "two (" in report and "reachable (heard" in report
        assert "mDNS: " in report and "refused" not in report and "hint: firewall" not in report

        report = _doctor(loner, "--mdns-seconds", "0")
        assert "peers known: 0" in report
        assert f"refused: {boot}: its TCP port answers but the libp2p connection fails" in report
        assert "do not share the cluster secret" in report
        assert "hint: this node sees no other node." in report
        # test nodes run --no-mdns: doctor says so rather than suggest firewall rules for mDNS
        assert "mDNS: off on this node (--no-mdns)" in report and "hint: mDNS is off here" in report
        assert "hint: firewall" not in report

        # --api pointing at a libp2p port says so and names the API
        port = boot.split("/")[4]
        proc = subprocess.run([sys.executable, "-m", "exo_p2p", "nodes", "--api", f"127.0.0.1:{port}"],
                              capture_output=True, text=True, env=clean_env(), timeout=60)  # fmt: skip
        assert proc.returncode == 1
        (line,) = proc.stderr.strip().splitlines()
        assert "probably a node's libp2p port" in line and "try --api http://127.0.0.1:52515" in line, line
    finally:
        for node in nodes:
            node.stop()
    for node in nodes:
        records = json_records(node.log_path)
        assert all(r.get("node") == node.extra_args[1] for r in records)
