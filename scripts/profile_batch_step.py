"""Where one batched decode step's time goes (continuous batching), on the embedded model in this
process (float32 weights, the optimised BLAS preloaded as a runner preloads it).

For each batch size B it fills an engine's decode batch with B greedy sequences, then times
``steps`` decode steps end to end (``Engine.step``), and separately, on the same batch:
the forward pass alone (``[B, 1]`` tokens, evaluated), the per-row sampling alone (on
evaluated logits), and the Python bookkeeping of a step (consume + detokenize of B tokens).
The batch's KV cache and last tokens are what the engine's last decode step handed its stage
(``LastBatchStep``: the ``Stage`` protocol's ``next_tokens`` arguments).

    .venv/bin/python scripts/profile_batch_step.py [--sizes 1 4 8 16] [--steps 20]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--model-dir", type=Path)
    ap.add_argument("--speculative", choices=("off", "ngram"), default="off",
                    help="one token per step (off: what this profile breaks down), or drafting on")
    args = ap.parse_args()
    from worker import blas

    if "EXO_P2P_PROFILE_CHILD" not in os.environ:  # re-run with the BLAS preloaded
        env = blas.runner_environment(dict(os.environ), blas.find_optimised_blas(), blas.offered_cores())
        env["EXO_P2P_PROFILE_CHILD"] = "1"
        sys.exit(subprocess.call([sys.executable, *sys.argv], env=env))
    import mlx.core as mx

    from exo_p2p.models.stores.embedded import find_embedded_gguf
    from exo_p2p.models.gguf.importer import import_gguf
    from exo_p2p.types.engine import EngineSettings
    from exo_p2p.types.tasks import ChatMessage, GenerationParams
    from worker.engine.builder import build_engine
    from worker.engine.loading.loader import load_all
    from worker.engine.pipeline import LocalStage, logprobs_of, sample_rows

    class LastBatchStep(LocalStage):
        """The whole model, keeping what the last decode step ran on: the tokens it fed
        (``[B, 1]``) and the batch's KV cache (one ``BatchKVCache`` per layer)."""

        tokens = None
        cache = None

        def next_tokens(self, model, tokens, cache, samplers):
            self.tokens, self.cache = tokens, cache
            return super().next_tokens(model, tokens, cache, samplers)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir or import_gguf(find_embedded_gguf(), Path(tmp) / "smollm2")
        loaded = load_all(model_dir, weights_dtype="float32")
        loaded = dataclasses.replace(loaded, eos_token_ids=frozenset())
        print(f"load average {os.getloadavg()[0]:.1f}; CPU ms (this process, all threads) per decode step (B sequences),"
              " then the step's wall-clock ms and tokens/s:")
        print("| B | step | forward | sampling | bookkeeping | step wall ms | tok/s (wall) |")
        print("|---|---|---|---|---|---|---|")
        for b in args.sizes:
            stage = LastBatchStep()
            gen = build_engine(loaded, EngineSettings(prefill_chunk_size=256, max_batch=b, speculative=args.speculative), stage=stage)
            for i in range(b):
                gen.submit(f"t{i}", GenerationParams(messages=(ChatMessage("user", f"Tell a story number {i}."),),
                                                     max_tokens=10 * args.steps + 50, temperature=0.0))
            for _ in range(10_000):
                gen.step()
                if len(gen.batch.rows) == b:
                    break
            for _ in range(3):
                gen.step()
            t0, w0 = time.process_time(), time.perf_counter()
            for _ in range(args.steps):
                gen.step()
            step, wall = (time.process_time() - t0) / args.steps, (time.perf_counter() - w0) / args.steps
            rows = gen.batch.rows
            assert stage.tokens is not None and stage.tokens.shape[0] == len(rows) == b
            y = stage.tokens  # [B, 1], the last step's (evaluated) tokens
            model, cache, samplers = loaded.model, stage.cache, [r.sampler for r in rows]
            t0 = time.process_time()
            for _ in range(args.steps):
                logits = model(y, cache=cache)
                mx.eval(logits)
            fwd = (time.process_time() - t0) / args.steps
            t0 = time.process_time()
            for _ in range(args.steps):
                mx.eval(sample_rows(samplers, logprobs_of(logits)))
            samp = (time.process_time() - t0) / args.steps
            t0 = time.process_time()
            for _ in range(args.steps):
                for row in rows:
                    row.detokenizer.add_token(42)
                    row.stops.feed(row.detokenizer.last_segment)
            book = (time.process_time() - t0) / args.steps
            print(f"| {b} | {step * 1e3:.1f} | {fwd * 1e3:.1f} | {samp * 1e3:.1f} | {book * 1e3:.2f} | {wall * 1e3:.1f} | {b / wall:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
