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
ours; the target: ≥ 0.9). The three are timed alternately, one call each per round, after
one untimed call each; each figure is the median of ``--reps`` rounds. The load average is
printed with the figures (the machine may be shared).

Usage: ``python scripts/bench_images.py [--steps N] [--reps N] [--sizes 64,128,256]``.
Needs mflux (``scripts/install.sh --images``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker import blas  # noqa: E402

# mflux in-process gets the BLAS the node's runners preload (worker/blas.py), before MLX loads
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(blas.offered_cores()))
PRELOADED = blas.preload_in_process(blas.find_optimised_blas())

from tests.support.cluster import NodeProcess  # noqa: E402
from tests.support.models.synthetic_flux2 import make_tiny_flux2  # noqa: E402

MODEL, PIPE, PROMPT, SEED = "bench-flux2", "bench-flux2-pipe", "a lighthouse on a cliff at dusk", 42


def timed(call) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def measure(node: NodeProcess, model_dir: Path, sizes: list[int], steps: int, reps: int) -> list[tuple]:
    """(size, {"one"|"pipe"|"mflux": median s/image}) per size, timed alternately."""
    import openai

    from worker.image.load import load_pipeline

    client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=3600)
    pipeline = load_pipeline(model_dir)

    def ours(model: str, side: int):  # type: ignore[no-untyped-def]
        return lambda: client.images.generate(model=model, prompt=PROMPT, size=f"{side}x{side}",
                                              extra_body={"seed": SEED, "steps": steps})

    rows = []
    for side in sizes:
        calls = {"one": ours(MODEL, side), "pipe": ours(PIPE, side),
                 "mflux": lambda: pipeline.generate_image(seed=SEED, prompt=PROMPT, num_inference_steps=steps,
                                                          height=side, width=side)}
        for call in calls.values():
            call()
        times: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(reps):
            for k, call in calls.items():
                times[k].append(timed(call))
        rows.append((side, {k: statistics.median(v) for k, v in times.items()}))
    return rows


def place_both(a: NodeProcess, b: NodeProcess) -> None:
    """The pipeline over both nodes, then the whole model on its rank-1 node."""
    from tests.support.cluster import wait_until

    wait_until(lambda: len(a.get("/nodes", timeout=5).json()) == 2, 60, what="2 nodes in the cluster")
    a.place_and_wait(PIPE, timeout=600, min_nodes=2)
    inst = next(v for v in a.get("/state", timeout=10).json()["instances"].values() if v["model_id"] == PIPE)
    rank1 = next(s["node_id"] for s in inst["shards"] if s["rank"] == 1)
    a.place_and_wait(MODEL, timeout=600, min_nodes=1, nodes=[rank1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sizes", default="64,128,256")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        models = Path(tmp) / "models"
        make_tiny_flux2(models / MODEL)
        shutil.copytree(models / MODEL, models / PIPE)
        a = NodeProcess(Path(tmp) / "a", extra_args=["--models-dir", str(models)])
        nodes = [a]
        try:
            a.start()
            boot = [x for addr in a.addrs() for x in ("--bootstrap", addr)]
            nodes.append(NodeProcess(Path(tmp) / "b", cluster=a.cluster, extra_args=["--models-dir", str(models), *boot]))
            nodes[1].start()
            place_both(a, nodes[1])
            rows = measure(a, models / MODEL, sizes, args.steps, args.reps)
        except Exception:
            for n in nodes:
                print(n.log_tail(400), file=sys.stderr)
            raise
        finally:
            for n in nodes:
                n.stop()
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"BLAS in process: {PRELOADED or 'reference'}; {args.steps} steps; median of {args.reps} alternating rounds; "
          f"load average {load}; {time.monotonic() - started:.0f} s in all")
    print("| size | 1 node s/image | 1 node s/step | 2-node pipeline s/image | 2-node s/step | mflux s/image "
          "| mflux s/step | 1 node ÷ mflux | 2-node ÷ mflux |")
    print("|---|---|---|---|---|---|---|---|---|")
    for side, t in rows:
        one, pipe, lib = t["one"], t["pipe"], t["mflux"]
        print(f"| {side}x{side} | {one:.3f} | {one / args.steps:.3f} | {pipe:.3f} | {pipe / args.steps:.3f} | "
              f"{lib:.3f} | {lib / args.steps:.3f} | {lib / one:.2f} | {lib / pipe:.2f} |")


if __name__ == "__main__":
    main()
