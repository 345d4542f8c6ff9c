"""Where a restarted node's rejoin time goes (docs/architecture.md#rules "Timeouts").

A 3-node cluster of real ``exo-p2p node`` processes on 127.0.0.1 (tiny synthetic model, no
download) serving one 2-node instance. Each round SIGKILLs one follower's node process,
keeps it down ``--down`` s, restarts it with the same data dir (at ``--log-level debug``)
and prints, in seconds since the restart, when:

- ``first log line``: the process has imported its modules and built the node (its identity
  is read);
- ``host up``: the libp2p host listens;
- ``peer up`` (first): the first heartbeat from a peer arrived;
- ``following``: it follows the master;
- ``node ready``: its API answers;
- ``profile indexed``: the master's State lists the node with its new boot id;
- ``full mesh``: the master's State holds every edge of the 3 nodes;
- ``instance ready``: an instance of the model is ready again;

and the number of failed direct streams to the master in the node's log (``direct ...
failed``, with their errors). Also printed: the fault-to-recovery time as ``scripts/chaos.py``
counts it (the down time included). Usage: ``python scripts/rejoin_timeline.py [--rounds N]
[--down S] [--target any|holder|spare]`` (``holder``: a node serving a shard of the instance).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.models.synthetic_models import make_synthetic_model  # noqa: E402
from tests.support.cluster import NodeProcess, full_mesh, nodes_cleanup, self_id, state_of, wait_until  # noqa: E402

MODEL = "tiny"
MARKS = ("host up", "peer up", "following master", "node ready")


def log_marks(path: Path, since_wall: float) -> tuple[dict[str, float], list[str]]:
    """Wall times of the first log line and of each of ``MARKS`` written after ``since_wall``,
    and the errors of failed direct streams."""
    marks: dict[str, float] = {}
    errors: list[str] = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
            at = datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError, TypeError):
            continue
        if at < since_wall:
            continue
        marks.setdefault("first log line", at)
        event = rec.get("event", "")
        if event in MARKS:
            marks.setdefault(event, at)
        if event.startswith("direct") and "failed" in event:
            errors.append(f"{at - since_wall:6.2f} s {event}: {rec.get('error', '')[:110]}")
        elif event.startswith(("Health check failed", "Aborting connection", "MultiselectClient handshake")):
            errors.append(f"{at - since_wall:6.2f} s libp2p: {event[:110]}")
    return marks, errors


def instance_ready(node: NodeProcess) -> bool:
    try:
        return any(v["model"] == MODEL and v["status"] == "ready" for v in node.get("/instances", timeout=2).json())
    except Exception:  # noqa: BLE001 - API busy or down: not ready
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--down", type=float, default=6.0)
    ap.add_argument("--target", choices=["any", "holder", "spare"], default="holder")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--debug-all", action="store_true", help="every node at --log-level debug (libp2p's own warnings too)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="exo-rejoin-"))
    models = base / "models"
    make_synthetic_model(models / MODEL, n_layers=6, hidden_size=128, intermediate_size=256, seed=5)
    name = f"rejoin-{os.getpid()}"
    nodes: list[NodeProcess] = []
    totals: list[float] = []
    with nodes_cleanup(nodes):
        debug = ["--log-level", "debug"] if args.debug_all else []
        first = NodeProcess(base / "n0", cluster=name, extra_args=["--models-dir", str(models), *debug])
        nodes.append(first)
        first.start()
        boot = first.addrs()[0]
        for i in (1, 2):
            n = NodeProcess(base / f"n{i}", cluster=name, extra_args=["--models-dir", str(models), "--bootstrap", boot, *debug])
            nodes.append(n)
            n.start()
        ids = [self_id(n) for n in nodes]
        wait_until(lambda: all((s := state_of(n)) and len(s["nodes"]) == 3 and full_mesh(s) for n in nodes), 60, what="cluster of 3")
        r = first.post("/instances", json={"model": MODEL, "min_nodes": 2}, timeout=30)
        assert r.status_code == 201, r.text
        wait_until(lambda: instance_ready(first), 120, what="instance ready")
        print(f"load average {os.getloadavg()[0]:.2f}; {args.rounds} rounds, down {args.down:.0f} s, target {args.target}", flush=True)
        for rnd in range(args.rounds):
            time.sleep(2.0)
            s = state_of(nodes[0])
            master = ids.index(s["master"])
            holders = {sh["node_id"] for inst in s["instances"].values() for sh in inst["shards"]}
            followers = [i for i in range(3) if i != master]
            pick = {"any": followers, "holder": [i for i in followers if ids[i] in holders] or followers,
                    "spare": [i for i in followers if ids[i] not in holders] or followers}[args.target]
            target = rng.choice(pick)
            node = nodes[target]
            watcher = nodes[master]
            old_boot = s["nodes"][ids[target]]["boot_id"]
            t_fault = time.monotonic()
            node.kill()
            time.sleep(args.down)
            node.extra_args = [a for a in node.extra_args if a not in ("--log-level", "debug")] + ["--log-level", "debug"]
            wall0, t0 = time.time(), time.monotonic()
            node.start(timeout=90)
            seen: dict[str, float] = {}
            deadline = t0 + 120
            while time.monotonic() < deadline and len(seen) < 3:
                ms = state_of(watcher, timeout=2)
                now = time.monotonic() - t0
                if ms is not None:
                    prof = ms["nodes"].get(ids[target])
                    if prof is not None and prof["boot_id"] != old_boot:
                        seen.setdefault("profile indexed", now)
                        if len(ms["nodes"]) == 3 and full_mesh(ms):
                            seen.setdefault("full mesh", now)
                if "full mesh" in seen and instance_ready(watcher):
                    seen.setdefault("instance ready", now)
                time.sleep(0.1)
            marks, errors = log_marks(node.log_path, wall0)
            rows = {k: v - wall0 for k, v in marks.items()} | seen
            total = time.monotonic() - t_fault if "instance ready" in seen else float("nan")
            if "instance ready" in seen:
                total = seen["instance ready"] + (t0 - t_fault)
            totals.append(total)
            print(f"round {rnd + 1}: node {target} ({'holder' if ids[target] in holders else 'spare'}), load {os.getloadavg()[0]:.2f}; "
                  f"fault -> instance ready {total:.1f} s (down {t0 - t_fault:.1f} s)", flush=True)
            for k, v in sorted(rows.items(), key=lambda kv: kv[1]):
                print(f"    {v:6.2f} s  {k}", flush=True)
            print(f"    direct streams failed / libp2p warnings: {len(errors)}", flush=True)
            for e in errors[:12]:
                print(f"      {e}", flush=True)
        ok = sorted(t for t in totals if t == t)
        if ok:
            print(f"fault -> instance ready: median {ok[len(ok) // 2]:.1f} s, max {max(ok):.1f} s over {len(ok)} rounds "
                  f"({len(totals) - len(ok)} not recovered)", flush=True)
    if args.keep:
        print(f"logs in {base}")
    else:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
