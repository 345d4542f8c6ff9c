"""Models from a hub, measured against the local stand-in hub (``tests/support/models/hub_server.py``).

One run, on this machine, with an MLX-format copy of the embedded model served as
``org/smol`` (``--model synthetic`` serves a tiny synthetic model instead):

1. download rate: ``huggingface_hub.snapshot_download`` of the repo into a fresh cache (the
   baseline), then ``POST /models/pull`` of it on a fresh node once it has started (range
   requests into a verified partial copy, each file checked against the hub's SHA-256, the
   pull's own ``elapsed``): MB/s of each, alternating, ``--rounds`` times; the median of
   each and the ratio of the medians (target ≥ 0.8), with every round's figures and the
   load average (the machine may be shared);
2. hub bytes of placements of a model no node holds: a 2-node and a 3-node pipeline on fresh
   nodes, the bytes the hub served in all ÷ the model's size (target ≤ 1.05), per node too.

    .venv/bin/python scripts/bench_hub.py [--model embedded|synthetic] [--rounds 3] [--nodes 2 3] [--json]

``--nodes`` with no sizes measures the download rate only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.cluster import NodeProcess, converged, self_id, wait_until  # noqa: E402
from tests.support.models.hub_server import HubServer  # noqa: E402

NAME = "org/smol"


def model_dir(kind: str, tmp: Path) -> Path:
    """The directory the stand-in serves: the embedded model imported into MLX format, or a
    tiny synthetic one."""
    if kind == "synthetic":
        from tests.support.models.synthetic_models import make_synthetic_model

        return make_synthetic_model(tmp / "synthetic", n_layers=8, hidden_size=256, intermediate_size=512, seed=1)
    from exo_p2p.models.stores.embedded import EMBEDDED_MODEL_ID
    from exo_p2p.models.stores.store import ModelStore

    return ModelStore(tmp / "import").resolve(EMBEDDED_MODEL_ID)


def baseline(hub: HubServer, tmp: Path) -> float:
    """Seconds of ``snapshot_download`` of the repo into a fresh cache."""
    from huggingface_hub import snapshot_download

    start = time.monotonic()
    snapshot_download(NAME, endpoint=hub.endpoint, cache_dir=str(tmp / "hf-baseline"))
    return time.monotonic() - start


def node_env(hub: HubServer, path: Path) -> dict:
    return {"HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0", "HF_HOME": str(path / "hf")}


POLL = 0.25
"""Seconds between two looks at the pull's progress: the figure is the pull's own
``elapsed``, so a faster poll only takes CPU from the pull it measures."""


def pull_seconds(hub: HubServer, tmp: Path) -> float:
    """Seconds of a node's pull of the repo (as the pull reports it), once the node has
    started (its profile, with free disk, is in its State: its start-up work is done)."""
    node = NodeProcess(tmp / "puller", env=node_env(hub, tmp / "puller")).start()
    try:
        me = self_id(node)
        wait_until(lambda: node.get("/state").json()["nodes"].get(me, {}).get("models_disk_free") is not None,
                   60, what="node started")
        r = node.post("/models/pull", json={"model": NAME})
        r.raise_for_status()

        def done():
            pulls = {p["model"]: p for p in node.get("/models/pulls").json()}
            p = pulls.get(NAME, {})
            if p.get("state") == "failed":
                raise RuntimeError(p)
            return p if p.get("state") == "done" else None

        return wait_until(done, 600, interval=POLL, what="pull")["elapsed"]
    finally:
        node.stop()


def placement_bytes(hub: HubServer, tmp: Path, n: int) -> dict:
    """Hub bytes per node of an ``n``-node pipeline of the repo on fresh nodes."""
    nodes: list[NodeProcess] = []
    try:
        for i in range(n):
            path = tmp / f"p{n}-{i}"
            extra = [x for addr in nodes[0].addrs() for x in ("--bootstrap", addr)] if nodes else []
            nodes.append(NodeProcess(path, cluster=nodes[0].cluster if nodes else None, extra_args=extra,
                                     env=node_env(hub, path)).start())
        wait_until(lambda: converged(nodes, n), 60, what="cluster")
        ids = [self_id(x) for x in nodes]
        wait_until(lambda: all(nodes[0].get("/state").json()["nodes"].get(i, {}).get("models_disk_free") is not None
                               for i in ids), 60, what="free disk")
        before = {i: hub.hub_bytes(i) for i in ids}
        r = nodes[0].post("/instances", json={"model": NAME, "min_nodes": n, "nodes": ids}, timeout=120)
        r.raise_for_status()
        # a loaded machine may re-place it (a node timed out): any ready instance of it counts,
        # and the instances seen are reported (a re-placement on fewer nodes fetches more)
        seen: set[str] = set()

        def ready() -> bool:
            listed = [i for i in nodes[0].get("/instances").json() if i.get("model") == NAME]
            seen.update(i["instance_id"] for i in listed)
            return any(i.get("status") == "ready" for i in listed)

        wait_until(ready, 900, what="ready")
        if len(seen) > 1:
            print(f"  ({len(seen)} instances placed: re-placed after a failure)", file=sys.stderr, flush=True)
        return {i: hub.hub_bytes(i) - before[i] for i in ids}
    finally:
        for x in nodes:
            x.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("embedded", "synthetic"), default="embedded")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rounds", type=int, default=3, help="download-rate rounds (the median counts)")
    parser.add_argument("--nodes", type=int, nargs="*", default=[2, 3],
                        help="pipeline sizes to place (none: the download rate only)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d, HubServer() as hub:
        tmp = Path(d)
        served = model_dir(args.model, tmp)
        hub.add_dir(NAME, served)
        size = sum(len(b) for b in hub.repos[NAME].files.values())
        os.environ["HF_HUB_OFFLINE"] = "0"
        say = (lambda line: None) if args.json else (lambda line: print(line, flush=True))
        say(f"model {size / 1e6:.1f} MB")
        out: dict = {"model_bytes": size, "rounds": []}
        for i in range(max(1, args.rounds)):  # alternating, the median counts: the machine may be shared
            base, pull = baseline(hub, tmp / f"b{i}"), pull_seconds(hub, tmp / f"r{i}")
            one = {"snapshot_download_mb_s": size / base / 1e6, "pull_mb_s": size / pull / 1e6,
                   "load": round(os.getloadavg()[0], 1)}
            out["rounds"].append(one)
            say(f"  round {i + 1}: snapshot_download {one['snapshot_download_mb_s']:.1f} MB/s, pull "
                f"{one['pull_mb_s']:.1f} MB/s, ratio {one['pull_mb_s'] / one['snapshot_download_mb_s']:.2f} "
                f"(load {one['load']})")
        for key in ("snapshot_download_mb_s", "pull_mb_s"):
            out[key] = statistics.median(r[key] for r in out["rounds"])
        out["rate_ratio"] = out["pull_mb_s"] / out["snapshot_download_mb_s"]
        out["round_ratio_median"] = statistics.median(r["pull_mb_s"] / r["snapshot_download_mb_s"] for r in out["rounds"])
        say(f"median: snapshot_download {out['snapshot_download_mb_s']:.1f} MB/s, pull {out['pull_mb_s']:.1f} MB/s, "
            f"ratio {out['rate_ratio']:.2f} (target >= 0.8; median of the rounds' ratios "
            f"{out['round_ratio_median']:.2f})")
        for n in args.nodes:
            per_node = placement_bytes(hub, tmp, n)
            out[f"hub_ratio_{n}_nodes"] = sum(per_node.values()) / size
            out[f"per_node_{n}"] = sorted(per_node.values())
            say(f"{n}-node pipeline: hub bytes {sum(per_node.values()) / 1e6:.1f} MB = "
                f"{out[f'hub_ratio_{n}_nodes']:.3f} x model (target <= 1.05); "
                f"per node {[round(b / 1e6, 1) for b in out[f'per_node_{n}']]} MB")
    if args.json:
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
