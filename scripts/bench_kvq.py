"""Decode tokens/s of 16 streams with a full-precision, a q8 and a q4 KV cache, side by side.

The embedded model in this process (float32 weights, the optimised BLAS preloaded as a runner
preloads it; ``--kv-cache-bits`` 0, 8, 4 alternating run by run, the order reversed every
other run so drifting load hits all alike). Each run: ``--streams`` greedy requests (prompts of
``--prompt-tokens`` tokens, each its own, end tokens masked so all run ``--max-tokens``)
decoding in one batch; decode tokens/s = tokens sampled after the last stream's first token ÷
the time from then to the end (prefill excluded). Prints the load average, the medians and
q ÷ full (docs/benchmarks.md "Quantized KV cache").

    .venv/bin/python scripts/bench_kvq.py [--runs 3] [--streams 16] [--max-tokens 128] [--prompt-tokens 512]
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
os.environ.setdefault("HF_HUB_OFFLINE", "1")

BITS = (0, 8, 4)
MAX_STEPS = 200_000


def prompts(n: int, tokens: int) -> list[str]:
    """``n`` different prompts of about ``tokens`` tokens."""
    words = "the harbour town wakes before dawn and fishermen check their nets by lamplight".split()
    return [f"Story {i}: " + " ".join(words[(i + j) % len(words)] for j in range(tokens)) + "\nContinue it."
            for i in range(n)]


def decode_rate(gen, requests) -> float:  # noqa: ANN001 - an Engine, [(task id, GenerationParams)]
    """Aggregate decode tokens/s of ``requests`` decoding together (module docstring)."""
    from exo_p2p.types.chunks import ErrorChunk, FinishChunk, TokenChunk

    for task_id, params in requests:
        gen.submit(task_id, params)
    started: set[str] = set()
    t0, after, done = None, 0, 0
    for _ in range(MAX_STEPS):
        for chunk in gen.step():
            if isinstance(chunk, ErrorChunk):
                raise RuntimeError(chunk.error.message)
            if isinstance(chunk, TokenChunk):
                if t0 is not None:
                    after += 1
                started.add(chunk.task_id)
            if isinstance(chunk, FinishChunk):
                done += 1
        if t0 is None and len(started) == len(requests):
            t0 = time.perf_counter()
        if done == len(requests):
            break
    assert t0 is not None
    return after / max(time.perf_counter() - t0, 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    args = ap.parse_args()
    from worker import blas

    if "EXO_P2P_BENCH_CHILD" not in os.environ:  # re-run with the BLAS preloaded
        env = blas.runner_environment(dict(os.environ), blas.find_optimised_blas(), blas.offered_cores())
        env["EXO_P2P_BENCH_CHILD"] = "1"
        sys.exit(subprocess.call([sys.executable, *sys.argv], env=env))
    from exo_p2p.models.gguf.importer import import_gguf
    from exo_p2p.models.stores.embedded import find_embedded_gguf
    from exo_p2p.types.engine import EngineSettings
    from exo_p2p.types.tasks import ChatMessage, GenerationParams
    from worker.engine.builder import build_engine
    from worker.engine.loading.loader import load_all

    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        loaded = load_all(import_gguf(find_embedded_gguf(), Path(tmp) / "smollm2"), weights_dtype="float32")
        mask = tuple((t, -100.0) for t in loaded.eos_token_ids)
        requests = [(f"s{i}", GenerationParams(messages=(ChatMessage("user", text),), max_tokens=args.max_tokens,
                                               temperature=0.0, logit_bias=mask))
                    for i, text in enumerate(prompts(args.streams, args.prompt_tokens))]
        rates: dict[int, list[float]] = {b: [] for b in BITS}
        loads = [os.getloadavg()[0]]
        for run in range(args.runs):
            for bits in BITS if run % 2 == 0 else BITS[::-1]:
                gen = build_engine(loaded, EngineSettings(max_batch=args.streams, prompt_cache_bytes=0, kv_cache_bits=bits))
                rates[bits].append(decode_rate(gen, requests))
            loads.append(os.getloadavg()[0])
    full = statistics.median(rates[0])
    print(f"{args.streams} streams × {args.max_tokens} tokens after ~{args.prompt_tokens}-token prompts, SmolLM2-135M "
          f"float32 weights, median of {args.runs} alternating runs; load average {min(loads):.1f}–{max(loads):.1f}; "
          f"{time.monotonic() - started:.0f} s")
    print("| KV cache | decode tok/s (runs) | ÷ full precision |")
    print("|---|---|---|")
    for bits in BITS:
        name = "full precision" if bits == 0 else f"q{bits}"
        median = statistics.median(rates[bits])
        runs = ", ".join(f"{r:.1f}" for r in rates[bits])
        print(f"| {name} | {median:.1f} ({runs}) | **{median / full:.2f}×** |")


if __name__ == "__main__":
    main()
