"""Decode speed of a 2-node pipeline with the ring over a fast link vs a shaped one, and what
placement chose (docs/links.md, docs/benchmarks.md). Root only (network namespaces).

Two nodes in namespaces joined by two links (``tests/support/net/link_lab.py``): a veth pair (fast) and a
path through a router namespace shaped with ``tbf`` (``--rate``) and a relay adding
``--delay`` s each way. Waits until both nodes measured both links, places the tiny synthetic
model over the two nodes, prints the ring addresses placement chose, the preview's estimated
network cost and the decode tok/s of ``--tokens`` greedy tokens (``--runs`` requests, median);
then takes the fast link down, waits for the model to be served again over the shaped link and
measures the same. One run.

    .venv/bin/python scripts/bench_links.py [--rate 20mbit] [--delay 0.01] [--tokens 64] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.support.cluster import nodes_cleanup, wait_until  # noqa: E402
from tests.support.net.link_lab import LinkLab  # noqa: E402
from tests.support.net.netns_links import decode_rate, figures, ordered_dirs, place, preview_cost, served_on_two, start_lab_nodes, wait_measured  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", default="20mbit")
    parser.add_argument("--delay", type=float, default=0.01)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    from tests.support.models.synthetic_models import make_synthetic_model

    with tempfile.TemporaryDirectory() as tmp:
        models = Path(tmp) / "models"
        make_synthetic_model(models / "tiny", n_layers=4, seed=4)
        nodes: list = []
        with LinkLab(2, [(0, 1, "fast"), (0, 1, "slow")], rate=args.rate, delay=args.delay) as lab, nodes_cleanup(nodes):
            ids = start_lab_nodes(lab, ordered_dirs(Path(tmp), 2), models, nodes)
            (f0, f1), (s0, s1) = lab.addresses
            t0 = time.monotonic()
            wait_measured(nodes[0], ids, [(0, 1, [f1, s1]), (1, 0, [f0, s0])])
            print(f"links measured {time.monotonic() - t0:.1f} s after the cluster formed")
            for ip, kind in ((f1, "fast"), (s1, "shaped")):
                print(f"  node0 -> node1 {kind} {ip}: {figures(nodes[0], ids[0], ids[1])[ip]}")
            rows = []
            place(nodes[0], min_nodes=2)
            for label in ("fast", "shaped"):
                if label == "shaped":
                    lab.down(0)
                    t_down = time.monotonic()
                    ips = wait_until(lambda: served_on_two(nodes[0]), 240, interval=2, what="2 nodes over the shaped link")
                    print(f"fast link down: served again by 2 nodes after {time.monotonic() - t_down:.1f} s")
                else:
                    ips = wait_until(lambda: served_on_two(nodes[0]), 240, interval=2, what="a 2-node instance")
                chosen = "fast" if set(ips) == {f0, f1} else "shaped" if set(ips) == {s0, s1} else "mixed"
                rates = [decode_rate(nodes[0], args.tokens) for _ in range(args.runs)]
                rows.append((label, ips, chosen, preview_cost(nodes[0], 2), statistics.median(rates), rates))
            print("\n| ring over | ring addresses | placement chose | est. network µs/token | decode tok/s (median) | runs |")
            print("|---|---|---|---|---|---|")
            for label, ips, chosen, cost, rate, rates in rows:
                print(f"| {label} | {', '.join(ips)} | {chosen} | {cost} | {rate:.1f} | {', '.join(f'{r:.1f}' for r in rates)} |")
            print(f"\nfast ÷ shaped decode: {rows[0][4] / rows[1][4]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
