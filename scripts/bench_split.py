"""Speed-aware against memory-proportional pipeline split on two unequal loopback nodes.

Two ``exo-p2p node`` processes on this machine, the embedded SmolLM2-135M; the second node
("slow") and every process it spawns are held to ``--quota`` % of one core (default 30) by a
cgroup v1 cpu group this script makes under /sys/fs/cgroup/cpu and removes at the end, even
on failure (root needed; tests.support.cgroup). Both nodes calibrate their speed at start
(worker/calibrate) and publish it; the script waits for both figures.

Per round, alternating which split goes first: the model is placed on both nodes with
``split=speed`` and with ``split=memory`` (POST /instances; docs/placement-speed.md), and on
each: one greedy request (its output compared with a 1-node instance on the fast node), then
decode tok/s at 1 stream and at 8 streams at once (``--max-tokens`` each, non-streamed,
temperature 0; tok/s = completion tokens ÷ the round's wall time). Printed: each split's layer
ranges and preview estimates, tok/s per (split, streams), the ratio speed ÷ memory, whether
the outputs matched, the load average before and after.

    sudo .venv/bin/python scripts/bench_split.py [--quota 30] [--rounds 1] [--max-tokens 64]

About 3-6 minutes on a quiet 2-core machine (more under load).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_peers import Server, one_round  # noqa: E402
from tests.support import cgroup  # noqa: E402
from tests.support.speed_nodes import delete_and_wait, greedy, layer_ranges, speeds, start_pair  # noqa: E402

MODEL = "smollm2-135m-instruct"
PROMPT = "Name three rivers of Europe and one fact about each."
SPLITS = ("speed", "memory")


class Placed(Server):
    """One placed instance, requests sent through the fast node's API."""

    def __init__(self, node, split: str, pid: int) -> None:  # type: ignore[no-untyped-def]
        self.name, self.url, self.model, self.pid = split, node.url, MODEL, pid


def measure(fast, slow, split: str, args: argparse.Namespace, reference: str, names: dict, offset: int) -> dict:  # type: ignore[no-untyped-def]
    """Place ``split``, check its greedy output, time 1 and 8 streams, delete it."""
    view = fast.place_and_wait(MODEL, min_nodes=2, split=split, timeout=600)
    try:
        spans = {names[n]: r for n, r in layer_ranges(view).items()}
        same = greedy(fast, MODEL, PROMPT, args.max_tokens) == reference
        server = Placed(fast, split, fast.proc.pid)
        cells = {n: one_round(server, n, args.max_tokens, False, offset) for n in args.streams}
        return {"spans": spans, "same": same, "tps": {n: c["tps"] for n, c in cells.items()}}
    finally:
        delete_and_wait(fast, view["instance_id"])


def previews(fast, names: dict) -> None:  # type: ignore[no-untyped-def]
    """Print the 2-node pipeline preview of each split's estimate (the speed one is what placement does)."""
    for p in fast.get("/instances/previews", params={"model": MODEL}).json():
        if p["sharding"] == "pipeline" and p["world_size"] == 2 and not p["error"]:
            layers = ", ".join(f"{names[n]}: {k} layers" for n, k in zip(p["nodes"], p["layers"], strict=True))
            print(f"preview: {layers}; decode ~{(p['decode_us_per_token'] or 0) / 1000:.1f} ms/token against "
                  f"~{(p['memory_split_us_per_token'] or 0) / 1000:.1f} for the memory split; {p['split_reason']}")


def run(args: argparse.Namespace, tmp: Path) -> int:
    with cgroup.cpu_quota(f"exo-bench-split-{os.getpid()}", args.quota) as group:
        fast, slow = start_pair(tmp, group, ["--cpu-weights", args.cpu_weights, "--max-batch", "8"], timeout=300)
        try:
            print(f"speeds: {speeds(fast)}")
            names = {n["node_id"]: n["friendly_name"] for n in fast.get("/nodes").json()}
            previews(fast, names)
            one = fast.place_and_wait(MODEL, min_nodes=1, nodes=["fast"], timeout=600)
            reference = greedy(fast, MODEL, PROMPT, args.max_tokens)
            delete_and_wait(fast, one["instance_id"])
            results: dict[str, list[dict]] = {s: [] for s in SPLITS}
            for r in range(args.rounds):
                for split in (SPLITS if r % 2 == 0 else SPLITS[::-1]):
                    results[split].append(measure(fast, slow, split, args, reference, names, 100 * r))
            return report(results, args)
        finally:
            for node in (slow, fast):
                node.stop()


def report(results: dict[str, list[dict]], args: argparse.Namespace) -> int:
    """Print the table; 0 when every output matched one node's, else 1."""
    print(f"\n{MODEL}, slow node at {args.quota} % of a core, max_tokens {args.max_tokens}, {args.rounds} round(s), "
          f"medians; load average now {os.getloadavg()[0]:.1f}")
    for split in SPLITS:
        print(f"  {split:<6} split: {results[split][0]['spans']}")
    print("streams  speed tok/s  memory tok/s  speed/memory")
    for n in args.streams:
        tps = {s: statistics.median(c["tps"][n] for c in results[s]) for s in SPLITS}
        print(f"{n:>7}  {tps['speed']:>11.1f}  {tps['memory']:>12.1f}  {tps['speed'] / max(tps['memory'], 1e-9):>11.2f}x")
    same = all(c["same"] for s in SPLITS for c in results[s])
    print(f"greedy output identical to one node's: {same}")
    return 0 if same else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quota", type=int, default=30, help="percent of one core the slow node gets (1-100)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--cpu-weights", default="auto", choices=["auto", "float32", "stored"])
    args = parser.parse_args()
    if not cgroup.available():
        print("needs root and the cgroup v1 cpu controller at /sys/fs/cgroup/cpu", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a TERM still stops the nodes and removes the cgroup
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="bench-split-") as tmp:
        return run(args, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
