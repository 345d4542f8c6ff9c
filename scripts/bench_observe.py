"""What metrics and request records cost: ``bench_batch``'s concurrent round with them and
without, alternating on the same machine in the same run.

Starts two single ``exo-p2p node`` processes with the embedded model (each its own cluster,
``--max-batch 16``): node *on* with the defaults (``GET /metrics``, a record per request in the
log, ``requests.jsonl`` and ``GET /requests``) and node *off* with ``--no-metrics
--no-request-records``. Then ``--rounds`` rounds, each one round of ``--streams`` concurrent
streamed chat completions (greedy, ``--max-tokens`` each, ``bench_batch.concurrent``) on each
node — on first in even rounds, off first in odd ones — so a machine whose load drifts
(it is shared) weighs on both alike. While one node serves, the other idles.

Reports per round and as medians: the steady decode rate (tokens all streams received while
every one decoded ÷ that window, ``bench_batch.steady``), the round rate, and the CPU
seconds the node process (API, metrics, records) and its runner spent on the round; the
cost is 1 − off ÷ on of the median steady rate and of the CPU (target ≤ 2% of decode
tok/s at 16 streams), and — since metrics and records run in the node process only, never in
the runner — the node's extra CPU seconds per round as a share of the round's node + runner
CPU: what they take from the cores the runner decodes on, a figure a shared machine's
load moves far less than the wall clock. The 1-minute load average is printed with every round.

    .venv/bin/python scripts/bench_observe.py [--rounds 6] [--streams 16] [--max-tokens 48]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_batch import MODEL, aggregate, concurrent, cpu_seconds, steady  # noqa: E402
from tests.support.cluster import NodeProcess, nodes_cleanup  # noqa: E402

OFF = ["--no-metrics", "--no-request-records"]


def one_round(node: NodeProcess, streams: int, max_tokens: int, offset: int) -> dict[str, float]:
    """One concurrent round on ``node``: steady and round tok/s, node and runner CPU seconds."""
    cpu0 = cpu_seconds([node])
    done = concurrent(node.url, streams, max_tokens, offset=offset)
    cpu1 = cpu_seconds([node])
    rate = steady(done)
    return {"steady": rate if rate is not None else float("nan"), "round": aggregate(done),
            "node_cpu": cpu1["node"] - cpu0["node"], "runner_cpu": cpu1["runner"] - cpu0["runner"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6, help="rounds per node, alternating")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--max-batch", type=int, default=16)
    args = ap.parse_args()
    base = ["--max-batch", str(args.max_batch), "--prompt-cache-bytes", "0"]
    results: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as tmp:
        nodes = {"on": NodeProcess(Path(tmp) / "on", extra_args=base),
                 "off": NodeProcess(Path(tmp) / "off", extra_args=[*base, *OFF])}
        with nodes_cleanup(list(nodes.values())):
            for node in nodes.values():
                node.start()
            for name, node in nodes.items():
                node.place_and_wait(MODEL, timeout=900)
                concurrent(node.url, 2, 4)  # warm up
                print(f"node {name} ready: GET /metrics {node.get('/metrics').status_code}, "
                      f"GET /requests {node.get('/requests').status_code}", flush=True)
            for r in range(args.rounds):
                order = ("on", "off") if r % 2 == 0 else ("off", "on")
                for name in order:
                    res = one_round(nodes[name], args.streams, args.max_tokens, offset=r)
                    results[name].append(res)
                    print(f"round {r + 1} {name:>3}: steady {res['steady']:.1f} tok/s, round {res['round']:.1f} tok/s, "
                          f"CPU s node {res['node_cpu']:.2f} runner {res['runner_cpu']:.2f}; "
                          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    med = {name: {k: statistics.median(x[k] for x in rows) for k in rows[0]} for name, rows in results.items()}
    on, off = med["on"], med["off"]
    print(f"\n{MODEL}, {args.streams} streams x {args.max_tokens} tokens, {args.rounds} rounds each, medians:")
    for k, unit in (("steady", "tok/s"), ("round", "tok/s"), ("node_cpu", "CPU s"), ("runner_cpu", "CPU s")):
        print(f"  {k:>10}: with {on[k]:.2f} {unit}, without {off[k]:.2f} {unit}")
    print(f"cost of metrics and records: steady decode {1 - on['steady'] / off['steady']:+.1%} "
          f"(target <= 2%), round {1 - on['round'] / off['round']:+.1%}; node + runner CPU per round "
          f"{(on['node_cpu'] + on['runner_cpu']) / (off['node_cpu'] + off['runner_cpu']) - 1:+.1%}")
    # the metrics and records run in the node process only (the runner never knows of them):
    # their cost is the node's extra CPU, a share of all the CPU the round took on the cores
    # the node and its runner share; robust where the wall clock of a shared machine is not
    extra = on["node_cpu"] - off["node_cpu"]
    print(f"CPU cost of metrics and records: node {extra:+.2f} CPU s per round = {extra / (off['node_cpu'] + off['runner_cpu']):+.1%} "
          f"of the round's node + runner CPU (target <= 2%)")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (1 min), {os.getloadavg()[1]:.1f} (5 min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
