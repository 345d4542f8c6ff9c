"""A 2-node pipeline beside 1 node, real node processes on this machine, the same client load.

Two setups up side by side, the rounds alternating between them (as ``bench_peers.py``):

- **1 node**: one ``exo-p2p node`` serving the float32 weights (``bench_peers.float32_weights``:
  the embedded SmolLM2-135M converted once with ``mlx_lm.convert --dequantize --dtype
  float32``), ``--max-batch`` (default 16);
- **2 nodes**: two nodes in their own cluster (the second bootstraps from the first), the same
  weights from the same ``--models-dir``, the model placed with ``min_nodes 2`` (pipeline: each
  rank half of the layers; the ranks' MLX ring on 127.0.0.1), ``--micro-batches`` passed to
  both (``worker/engine/micro.py``; default: the node's own rule).

Each runner gets OpenBLAS and ``--threads`` BLAS threads (``--pipeline-threads`` for the ranks of
the 2-node setup). The load: for each N of ``--concurrency`` (default 16), N non-streamed greedy
chat requests at once (``bench_peers.one_round``), ``--max-tokens`` each; tok/s = completion
tokens ÷ the round's wall time. Printed per cell: tok/s of both, the ratio 2 nodes ÷ 1 node,
the CPU seconds of each setup's process trees (node + runners) and the load average.

    .venv/bin/python scripts/bench_pipeline_nodes.py [--concurrency 16] [--rounds 1]
        [--micro-batches N] [--threads 2] [--pipeline-threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_peers import Server, _tree_cpu, float32_weights, one_round  # noqa: E402
from tests.support.cluster import NodeProcess, converged, wait_until  # noqa: E402


def _node(path: Path, weights: Path, args: argparse.Namespace, threads: int, extra: list[str],
          cluster: str | None = None) -> NodeProcess:
    flags = ["--models-dir", str(weights.parent), "--max-batch", str(args.max_batch), "--cpu-weights", "stored"]
    if args.micro_batches is not None:
        flags += ["--micro-batches", str(args.micro_batches)]
    return NodeProcess(path, env={"OPENBLAS_NUM_THREADS": str(threads)}, extra_args=flags + extra, cluster=cluster)


class OneNode(Server):
    name = "1 node"

    def __init__(self, tmp: Path, weights: Path, args: argparse.Namespace) -> None:
        self.node = _node(tmp / "one", weights, args, args.threads, []).start()
        try:
            self.node.place_and_wait(weights.name, timeout=240)
        except BaseException:
            self.node.stop()
            raise
        self.url, self.model, self.pid = self.node.url, weights.name, self.node.proc.pid

    def stop(self) -> None:
        self.node.stop()


class TwoNodes(Server):
    name = "2-node pipeline"

    def __init__(self, tmp: Path, weights: Path, args: argparse.Namespace) -> None:
        self.nodes: list[NodeProcess] = []
        try:
            self._start(tmp, weights, args)
        except BaseException:
            self.stop()  # no node left behind by a failed start
            raise

    def _start(self, tmp: Path, weights: Path, args: argparse.Namespace) -> None:
        first = _node(tmp / "a", weights, args, args.pipeline_threads, []).start()
        self.nodes.append(first)
        boot = [x for a in first.addrs() for x in ("--bootstrap", a)]
        self.nodes.append(_node(tmp / "b", weights, args, args.pipeline_threads, boot, cluster=first.cluster).start())
        for _ in range(2):  # converged twice, 5 s apart: a second master claimed meanwhile is seen
            wait_until(lambda: converged(self.nodes, 2), 60, what="2-node cluster")
            time.sleep(5)
        for attempt in range(3):  # on a loaded machine a node may time out while the ranks load
            try:
                view = first.place_and_wait(weights.name, timeout=240, min_nodes=2)
                break
            except AssertionError as failed:
                print(f"placement failed ({failed}); placing again", flush=True)
                for inst in first.get("/instances").json():
                    httpx.delete(first.url + f"/instances/{inst['instance_id']}", timeout=30)
                wait_until(lambda: converged(self.nodes, 2), 60, what="2-node cluster")
        else:
            raise RuntimeError("the 2-node pipeline could not be placed in 3 attempts")
        if len(view["shards"]) != 2:
            raise RuntimeError(f"placed on {len(view['shards'])} node(s), not 2: {view}")
        self.url, self.model, self.pid = first.url, weights.name, first.proc.pid

    def cpu(self) -> float:
        return sum(_tree_cpu(n.proc.pid) for n in self.nodes)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16])
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--micro-batches", type=int, default=None, help="the nodes' --micro-batches (default: theirs)")
    ap.add_argument("--threads", type=int, default=2, help="BLAS threads of the 1-node runner")
    ap.add_argument("--pipeline-threads", type=int, default=2, help="BLAS threads of each pipeline rank")
    ap.add_argument("--work-dir", type=Path, default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                    / "exo-p2p" / "bench-peers", help="where the float32 weights are kept")
    args = ap.parse_args()

    weights = float32_weights(args.work_dir)
    results: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        setups: list[Server] = []
        try:
            setups.append(OneNode(tmp, weights, args))
            setups.append(TwoNodes(tmp, weights, args))
            for s in setups:  # warm-up, not counted
                one_round(s, 2, 8, False, 60)
            print(f"up: {', '.join(s.name for s in setups)}; load average {os.getloadavg()[0]:.1f}", flush=True)
            cell = 0
            for r in range(args.rounds):
                for n in args.concurrency:
                    order = setups if cell % 2 == 0 else setups[::-1]
                    cell += 1
                    for s in order:
                        out = one_round(s, n, args.max_tokens, False, offset=n + r)
                        results.setdefault((s.name, n), []).append(out)
                        print(f"round {r} N {n:>2} {s.name:<16} {out['tps']:6.1f} tok/s ({out['tokens']} tokens, "
                              f"{out['wall']:.1f} s), CPU {out['cpu']:.1f} s, load {os.getloadavg()[0]:.1f}", flush=True)
        finally:
            for s in setups:
                s.stop()
    print(f"\nmax_tokens {args.max_tokens}, batch {args.max_batch}, micro-batches {args.micro_batches or 'default'}, "
          f"BLAS threads {args.threads} / {args.pipeline_threads} per rank, {args.rounds} round(s), medians")
    for n in args.concurrency:
        one = statistics.median(c["tps"] for c in results[("1 node", n)])
        two = statistics.median(c["tps"] for c in results[("2-node pipeline", n)])
        cpu = [statistics.median(c["cpu"] for c in results[(name, n)]) for name in ("1 node", "2-node pipeline")]
        print(f"N {n:>2}: 1 node {one:.1f} tok/s, 2-node pipeline {two:.1f} tok/s, ratio {two / one:.2f}; "
              f"CPU s/round {cpu[0]:.1f} / {cpu[1]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
