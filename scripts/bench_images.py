"""Image benchmark: real ``exo-p2p node``s on 127.0.0.1 serving the tiny FLUX.2-klein
checkpoint (``tests/support/models/synthetic_flux2``) against mflux's own pipeline in this
process on the same checkpoint; prints a table (docs/images.md#figures has a run's figures).

Two nodes form one cluster; the checkpoint is placed twice under two names: over both nodes
as a 2-node pipeline (its transformer's blocks split, docs/images.md#pipeline), and whole on
the pipeline's second node (so no node holds two VAEs). For each size (64, 128, 256 px
square): seconds per image of ``images.generate`` through the ``openai`` client (b64_json PNG,
``--steps`` steps, fixed seed) on one node, on the 2-node pipeline, and of mflux's
``Flux2Klein.generate_image`` here; seconds per step of each (an image's time over its steps:
prompt encoding and decoding included); ours ÷ mflux as a speed ratio (mflux's seconds over
ours; the target: ≥ 0.9). Each figure is the median of ``--reps`` timed rounds after one
untimed round, the three alternating call by call (so all see the same load), each call with
a prompt not seen before (a node keeps the encodings of recent prompts,
``worker.image.prompts``; mflux does not: a repeated prompt would flatter ours).

mflux in process runs at a runner's priority (``worker.runner.priority``: nice +10,
SCHED_BATCH), as the node's runner does, unless ``--priority normal``: on a loaded machine a
nice-0 process beside a nice-10 runner measures the scheduler, not the path
(docs/images.md#speed). The load average is printed before and after.

Usage: ``python scripts/bench_images.py [--steps N] [--reps N] [--sizes 64,128,256] [--priority runner|normal]``.
Needs mflux (``scripts/install.sh --images``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker import blas  # noqa: E402

from worker.runner.priority import lower_this_thread  # noqa: E402



def parse_args() -> argparse.Namespace:
    """The command line (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sizes", default="64,128,256")
    parser.add_argument("--priority", choices=("runner", "normal"), default="runner",
                        help="mflux in process at a runner's priority (default) or at this shell's")
    return parser.parse_args()


ARGS = parse_args()  # before MLX loads: --priority decides the priority of its threads
RUNNER_PRIORITY = ARGS.priority == "runner"


def in_thread(call, lowered: bool):  # type: ignore[no-untyped-def]
    """``call()``'s result, run in a new thread lowered to a runner's priority when ``lowered``
    (a thread's priority is inherited by the threads it makes, as a runner's BLAS and MLX pools;
    the node process the main thread starts keeps its own)."""
    out: list = []

    def run() -> None:
        out.append(lower_this_thread() if lowered else [])
        out.append(call())

    thread = threading.Thread(target=run, name="bench-mflux")
    thread.start()
    thread.join()
    if len(out) < 2:
        raise RuntimeError("the measuring thread failed (its traceback is above)")
    return out


# mflux in-process gets the BLAS the node's runners preload (worker/blas.py), before MLX loads,
# its thread pool made at a runner's priority
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(blas.offered_cores()))
LOWERED, PRELOADED = in_thread(lambda: blas.preload_in_process(blas.find_optimised_blas()), RUNNER_PRIORITY)

from tests.support.cluster import NodeProcess  # noqa: E402
from tests.support.models.synthetic_flux2 import make_tiny_flux2  # noqa: E402

MODEL, PIPE, PROMPT, SEED = "bench-flux2", "bench-flux2-pipe", "a lighthouse on a cliff at dusk", 42


def alternating_medians(calls: list, reps: int) -> list[float]:  # type: ignore[type-arg]
    """The median seconds of ``reps`` timed rounds of each ``call(i)`` (``i`` the round, 0 the
    untimed first one), the calls alternating within each round."""
    times: list[list[float]] = [[] for _ in calls]
    for i in range(reps + 1):
        for call, spent in zip(calls, times):
            started = time.perf_counter()
            call(i)
            if i:
                spent.append(time.perf_counter() - started)
    return [statistics.median(t) for t in times]


def measure(node: NodeProcess, model_dir: Path, sizes: list[int], steps: int, reps: int) -> list[tuple]:
    """(size, {"one"|"pipe"|"mflux": median s/image}) per size, timed alternately."""
    import openai

    from worker.image.load import load_pipeline

    client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=3600)
    pipeline = load_pipeline(model_dir)

    def ours(model: str, side: int, tag: str):  # type: ignore[no-untyped-def]
        return lambda i: client.images.generate(model=model, prompt=f"{PROMPT} ({side} {tag} {i})", size=f"{side}x{side}",
                                                extra_body={"seed": SEED, "steps": steps})

    rows = []
    for side in sizes:
        def lib(i: int, side: int = side) -> None:
            pipeline.generate_image(seed=SEED, prompt=f"{PROMPT} ({side} mflux {i})", num_inference_steps=steps,
                                    height=side, width=side)

        one, pipe, mflux = alternating_medians([ours(MODEL, side, "one"), ours(PIPE, side, "pipe"), lib], reps)
        rows.append((side, {"one": one, "pipe": pipe, "mflux": mflux}))
    return rows


def place_both(a: NodeProcess, b: NodeProcess) -> None:
    """The pipeline over both nodes, then the whole model on its rank-1 node."""
    from tests.support.cluster import wait_until

    wait_until(lambda: len(a.get("/nodes", timeout=5).json()) == 2, 60, what="2 nodes in the cluster")
    a.place_and_wait(PIPE, timeout=600, min_nodes=2)
    inst = next(v for v in a.get("/state", timeout=10).json()["instances"].values() if v["model_id"] == PIPE)
    rank1 = next(s["node_id"] for s in inst["shards"] if s["rank"] == 1)
    a.place_and_wait(MODEL, timeout=600, min_nodes=1, nodes=[rank1])


def load_average() -> str:
    """The 1/5/15-minute load averages, as ``uptime`` prints them."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    args = ARGS
    load_before = load_average()
    sizes = [int(s) for s in args.sizes.split(",")]
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        models = Path(tmp) / "models"
        in_thread(lambda: make_tiny_flux2(models / MODEL), RUNNER_PRIORITY)  # MLX's first use makes its threads
        shutil.copytree(models / MODEL, models / PIPE)
        a = NodeProcess(Path(tmp) / "a", extra_args=["--models-dir", str(models)])
        nodes = [a]
        try:
            a.start()
            boot = [x for addr in a.addrs() for x in ("--bootstrap", addr)]
            nodes.append(NodeProcess(Path(tmp) / "b", cluster=a.cluster, extra_args=["--models-dir", str(models), *boot]))
            nodes[1].start()
            place_both(a, nodes[1])
            lowered, rows = in_thread(lambda: measure(a, models / MODEL, sizes, args.steps, args.reps), RUNNER_PRIORITY)
        except Exception:
            for n in nodes:
                print(n.log_tail(400), file=sys.stderr)
            raise
        finally:
            for n in nodes:
                n.stop()
    print(f"BLAS in process: {PRELOADED or 'reference'}; mflux priority: {'+'.join(lowered) or 'normal'}; "
          f"{args.steps} steps; median of {args.reps}, alternating; load average {load_before} before, "
          f"{load_average()} after; {time.monotonic() - started:.0f} s in all")
    print("| size | 1 node s/image | 1 node s/step | 2-node pipeline s/image | 2-node s/step | mflux s/image "
          "| mflux s/step | 1 node ÷ mflux | 2-node ÷ mflux |")
    print("|---|---|---|---|---|---|---|---|---|")
    for side, t in rows:
        one, pipe, lib = t["one"], t["pipe"], t["mflux"]
        print(f"| {side}x{side} | {one:.3f} | {one / args.steps:.3f} | {pipe:.3f} | {pipe / args.steps:.3f} | "
              f"{lib:.3f} | {lib / args.steps:.3f} | {lib / one:.2f} | {lib / pipe:.2f} |")


if __name__ == "__main__":
    main()
