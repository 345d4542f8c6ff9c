"""How late two nodes' trio loops run while the embedded model is placed on both, and why.

Starts a 2-node cluster on 127.0.0.1 (``tests/support/cluster.py``), then ``--rounds`` times: places
the embedded model with ``min_nodes 2``, waits for it to be ready (at most 300 s), deletes
it. Each node's ``exo_p2p.node.loop_watch`` measures its loop: printed per node are the worst lag
(``loop_lag_worst_ms``: how late a 50 ms sleep woke, the longest any heartbeat due meanwhile
waited), the wakes later than 0.5 s (``loop_lag_late_wakes``: a heartbeat interval missed),
the task steps the node logged with ``event loop lagged`` (name, wall s, thread CPU s: CPU
near wall is work on the loop, wall far above CPU is the process waiting for a core), the
``node timed out`` lines and ``became master`` lines, and the load average.

    .venv/bin/python scripts/measure_loop_lag.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.support.cluster import Cluster, wait_until  # noqa: E402

MODEL = "smollm2-135m-instruct"


def ready(node) -> str | None:  # type: ignore[no-untyped-def]
    return next((i["instance_id"] for i in node.get("/instances").json() if i["status"] == "ready" and len(i["shards"]) == 2), None)


def log_lines(node, event: str) -> list[dict]:  # type: ignore[no-untyped-def]
    out = []
    for line in node.log_path.read_text(errors="replace").splitlines():
        if f'"event": "{event}"' in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="exo-lag-") as tmp:
        cluster = Cluster(Path(tmp), 2)
        try:
            cluster.start(120)
            nodes = cluster.nodes
            windows: list[tuple[str, str]] = []  # (placed, ready), UTC ISO: while runners start
            for r in range(args.rounds):
                t0 = time.monotonic()
                placed = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
                resp = nodes[0].post("/instances", json={"model": MODEL, "min_nodes": 2}, timeout=120)
                assert resp.status_code == 201, resp.text
                inst = wait_until(lambda: ready(nodes[0]), 300, interval=0.5, what="a ready 2-node instance")
                windows.append((placed, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + ".999"))
                print(f"round {r}: ready at {time.strftime('%H:%M:%S', time.gmtime())}Z, in {time.monotonic() - t0:.1f} s, load {os.getloadavg()[0]:.1f}", flush=True)
                httpx.delete(f"{nodes[0].url}/instances/{inst}", timeout=30)
                wait_until(lambda: not nodes[0].get("/instances").json(), 60, what="instance deleted")
                time.sleep(2)
            for i, node in enumerate(nodes):
                c = node.get("/state").json().get("counters", {})
                print(f"node{i}: worst loop lag {c.get('loop_lag_worst_ms')} ms, wakes later than 0.5 s "
                      f"{c.get('loop_lag_late_wakes')}, timed out others {len(log_lines(node, 'node timed out'))}, "
                      f"became master {len(log_lines(node, 'became master'))}")
                lagged = log_lines(node, "event loop lagged")
                held = [ln for ln in lagged if any("load_tokenizer" in t for t in ln.get("busy_threads") or [])]
                starting = [ln for ln in lagged if any(a <= ln["timestamp"] <= b for a, b in windows)]
                print(f"  logged lags over 0.5 s: {len(lagged)}, with the tokenizer load holding the GIL: {len(held)}, "
                      f"while runners started (placed..ready): {len(starting)}, worst then "
                      f"{max((ln['lag_s'] for ln in starting), default=0)} s")
                for line in log_lines(node, "tokenizer loaded"):
                    print(f"  tokenizer loaded at {line['timestamp']} ({line.get('seconds')} s)")
                for line in lagged:
                    print(f"  lag {line['lag_s']} s; slow steps {line['slow_steps']}; busy threads {line.get('busy_threads')}")
            print(f"load average {os.getloadavg()}")
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
