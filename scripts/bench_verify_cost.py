"""What one verification pass costs: a forward pass of ``1 + K`` positions against one
position, single row, at the edit workload's context (its ~3k-token prompt prefilled), on
the embedded model (float32, the optimised BLAS preloaded as a runner preloads it).

Per ``K``: the median wall time of ``--reps`` passes (each evaluated, then rolled back so the
context stays the same; the ``K`` alternate within each repetition) and the ratio to ``K = 0``.
The load average is printed with the figures (docs/benchmarks.md "Speculative decoding").

    .venv/bin/python scripts/bench_verify_cost.py [--reps 20] [--k 0 1 2 4 8 16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pass_times(gen, ks: list[int], reps: int) -> dict[int, float]:  # noqa: ANN001 - an Engine
    """Median seconds of a ``1 + K``-position forward for each ``K`` (alternating K by K)."""
    import mlx.core as mx

    from worker.engine.forward import generation_stream
    from worker.engine.spec.rollback import rollback

    batch, stage, model = gen.batch, gen.stage, gen.loaded.model
    times: dict[int, list[float]] = {k: [] for k in ks}
    token = int(batch.next_tokens.tolist()[0])
    for _ in range(reps):
        for k in ks:
            fed = mx.array([[token] * (1 + k)], dtype=mx.uint32)
            start = time.perf_counter()
            with mx.stream(generation_stream):
                out = mx.argmax(stage.forward(model, fed, batch.cache), axis=-1)
                mx.eval(out)
            times[k].append(time.perf_counter() - start)
            rollback(batch.cache, [1 + k])
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--k", type=int, nargs="+", default=[0, 1, 2, 4, 8, 16])
    args = ap.parse_args()
    from worker import blas

    if "EXO_P2P_BENCH_CHILD" not in os.environ:  # re-run with the BLAS preloaded
        env = blas.runner_environment(dict(os.environ), blas.find_optimised_blas(), blas.offered_cores())
        env["EXO_P2P_BENCH_CHILD"] = "1"
        sys.exit(subprocess.call([sys.executable, *sys.argv], env=env))
    from bench_spec import WORKLOADS

    from exo_p2p.models.gguf.importer import import_gguf
    from exo_p2p.models.stores.embedded import find_embedded_gguf
    from exo_p2p.types.engine import EngineSettings
    from exo_p2p.types.tasks import ChatMessage, GenerationParams
    from worker.engine.builder import build_engine
    from worker.engine.loading.loader import load_all

    with tempfile.TemporaryDirectory() as tmp:
        loaded = load_all(import_gguf(find_embedded_gguf(), Path(tmp) / "smollm2"), weights_dtype="float32")
        gen = build_engine(loaded, EngineSettings(prefill_chunk_size=256, max_batch=1, prompt_cache_bytes=0,
                                                  speculative="off"))
        gen.submit("cost", GenerationParams(messages=(ChatMessage("user", WORKLOADS["edit"]),), max_tokens=4096,
                                            temperature=0.0))
        for _ in range(10_000):  # until the prompt is prefilled and the row decodes
            gen.step()
            if gen.batch.rows:
                break
        context = len(gen.batch.rows[0].tokens())
        load = os.getloadavg()[0]
        got = pass_times(gen, sorted(set(args.k)), args.reps)
        print(f"load average {load:.1f} → {os.getloadavg()[0]:.1f}; context {context} tokens; median of {args.reps}")
        print("| positions (1 + K) | ms per pass | ÷ one position |")
        print("|---|---|---|")
        for k, t in got.items():
            print(f"| {1 + k} | {t * 1000:.1f} | {t / got[min(got)]:.2f}× |")


if __name__ == "__main__":
    main()
