"""Image benchmark: one real ``exo-p2p node`` on 127.0.0.1 serving the tiny FLUX.2-klein
checkpoint (``tests/support/models/synthetic_flux2``) against mflux's own pipeline in this
process on the same checkpoint; prints a table (docs/images.md#figures has a run's figures).

For each size (64, 128, 256 px square): seconds per image of ``images.generate`` through the
``openai`` client (b64_json PNG, ``--steps`` steps, fixed seed) and of mflux's
``Flux2Klein.generate_image`` here, seconds per step of each (an image's time over its steps:
prompt encoding and decoding included), and ours ÷ mflux as a speed ratio (mflux's seconds
over ours; the target: ≥ 0.9). Each figure is the median of ``--reps`` timed calls after one
untimed call. A 2-node pipeline is not measured: image models run on one node (docs/images.md).

Usage: ``python scripts/bench_images.py [--steps N] [--reps N] [--sizes 64,128,256]``.
Needs mflux (``scripts/install.sh --images``).
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

from worker import blas  # noqa: E402

# mflux in-process gets the BLAS the node's runners preload (worker/blas.py), before MLX loads
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(blas.offered_cores()))
PRELOADED = blas.preload_in_process(blas.find_optimised_blas())

from tests.support.cluster import NodeProcess  # noqa: E402
from tests.support.models.synthetic_flux2 import make_tiny_flux2  # noqa: E402

MODEL, PROMPT, SEED = "bench-flux2", "a lighthouse on a cliff at dusk", 42


def median_seconds(call, reps: int) -> float:  # type: ignore[no-untyped-def]
    """The median seconds of ``reps`` calls of ``call()`` after one untimed call."""
    call()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(node: NodeProcess, model_dir: Path, sizes: list[int], steps: int, reps: int) -> list[tuple]:
    """(size, ours s/image, ours s/step, mflux s/image, mflux s/step, ratio) per size."""
    import openai

    from worker.image.load import load_pipeline

    client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=3600)
    pipeline = load_pipeline(model_dir)
    rows = []
    for side in sizes:
        ours = median_seconds(lambda: client.images.generate(model=MODEL, prompt=PROMPT, size=f"{side}x{side}",
                                                             extra_body={"seed": SEED, "steps": steps}), reps)
        lib = median_seconds(lambda: pipeline.generate_image(seed=SEED, prompt=PROMPT, num_inference_steps=steps,
                                                             height=side, width=side), reps)
        rows.append((side, ours, ours / steps, lib, lib / steps, lib / ours))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sizes", default="64,128,256")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        models = Path(tmp) / "models"
        make_tiny_flux2(models / MODEL)
        node = NodeProcess(Path(tmp) / "node", extra_args=["--models-dir", str(models)])
        try:
            node.start()
            node.place_and_wait(MODEL, timeout=600)
            rows = measure(node, models / MODEL, sizes, args.steps, args.reps)
        finally:
            node.stop()
    print(f"BLAS in process: {PRELOADED or 'reference'}; {args.steps} steps; median of {args.reps}")
    print("| size | ours s/image | ours s/step | mflux s/image | mflux s/step | ours ÷ mflux (speed) |")
    print("|---|---|---|---|---|---|")
    for side, ours, ours_step, lib, lib_step, ratio in rows:
        print(f"| {side}x{side} | {ours:.3f} | {ours_step:.3f} | {lib:.3f} | {lib_step:.3f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
