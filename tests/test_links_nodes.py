"""Links measured between real nodes on loopback (docs/links.md): figures in State with
bandwidth, shown by ``nodes``, ``doctor`` and previews, and steady links adding no events."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.support.cluster import NodeProcess, converged, nodes_cleanup, state_of, wait_until
from tests.support.cli_env import clean_env

pytestmark = pytest.mark.integration

MODEL = "tiny"


def _cli(node: NodeProcess, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "exo_p2p", *args, "--api", node.url],
                          capture_output=True, text=True, env=clean_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_two_nodes_measure_each_other_and_steady_links_add_no_events(tmp_path, models_dir):
    cluster = f"links-{os.getpid()}"
    nodes: list[NodeProcess] = []
    with nodes_cleanup(nodes):
        a = NodeProcess(tmp_path / "a", cluster=cluster, extra_args=["--name", "a", "--models-dir", str(models_dir)])
        nodes.append(a)
        a.start()
        b = NodeProcess(tmp_path / "b", cluster=cluster, extra_args=["--name", "b", "--models-dir", str(models_dir),
                                                                     "--bootstrap", a.addrs()[0]])
        nodes.append(b)
        b.start()
        wait_until(lambda: converged(nodes, 2), 60, what="2-node cluster")

        def measured():
            s = state_of(a)
            pairs = [f for sinks in (s or {}).get("links", {}).values() for figs in sinks.values() for f in figs.values()]
            return pairs if len(pairs) == 2 and all(f.get("bytes_per_s") for f in pairs) else None

        # the first round starts within a tick of the peer being connected; 30 s for a loaded machine
        figures = wait_until(measured, 30, interval=0.5, what="both directions measured, bandwidth included")
        assert all(f["address"] == "127.0.0.1" and 0 < f["rtt_us"] < 200_000 for f in figures), figures
        listing = _cli(a, "nodes")
        assert "links (measured" in listing and "a -> b at 127.0.0.1: RTT" in listing and "Mbit/s" in listing, listing
        assert "link at 127.0.0.1: RTT" in _cli(a, "doctor", "--mdns-seconds", "0.5")
        previews = a.get("/instances/previews", params={"model": MODEL}).json()
        two = next(p for p in previews if p["sharding"] == "pipeline" and p["world_size"] == 2 and not p["error"])
        assert two["network_us_per_token"] > 0 and two["links_measured"]

        # steady: over 60 s (4 rounds each way) at most a few figure events; CPU of the rounds
        before = {n.url: state_of(n)["counters"] for n in nodes}
        cpu0 = {n.url: _cpu_seconds(n.proc.pid) for n in nodes}
        window = 60.0
        time.sleep(window)
        after = {n.url: state_of(n)["counters"] for n in nodes}
        cpu1 = {n.url: _cpu_seconds(n.proc.pid) for n in nodes}
        for n in nodes:
            rounds = after[n.url]["link_rounds"] - before[n.url]["link_rounds"]
            events = after[n.url]["link_events"] - before[n.url]["link_events"]
            share = (cpu1[n.url] - cpu0[n.url]) / window
            print(f"{n.url}: {rounds} rounds, {events} link events, node CPU {100 * share:.2f} % over {window:.0f} s")
            assert rounds >= 3 and events <= 2, (rounds, events)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
