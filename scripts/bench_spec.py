"""Speculative decoding against none: single-stream decode tokens/s on three workloads, on
the embedded model in this process (float32 weights, the optimised BLAS preloaded as a runner
preloads it), the two settings alternating run by run; then a batch of 16 aggregate.

Workloads (greedy, ``--max-tokens`` each):
(a) edit: the prompt is a 300-line Python file and the request to rewrite it whole with one
    function renamed; (b) quote: a passage and the request to quote its second paragraph
    exactly, then summarise it; (c) prose: a story, nothing to copy.
Decode tokens/s counts the tokens after the first over the time after the first (prefill
excluded). Ratio = with ÷ without. llama-server is compared when it is on PATH (it is not
installed here: the column says so).

    .venv/bin/python scripts/bench_spec.py [--runs 2] [--max-tokens 192] [--batch 16]

The defaults are sized to finish in about 6 minutes on a quiet machine (estimated from quiet
rates of 15–25 tokens/s; the elapsed time is printed last). ``--workloads`` picks some of
them, ``--batch 0`` leaves out the batch line. The 2-node pipeline:
``scripts/bench_spec_pipeline.py``; a verification pass's cost: ``scripts/bench_verify_cost.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def edit_prompt() -> str:
    lines = []
    for i in range(60):
        lines += [f"def step_{i}(value, scale={i + 1}):", f'    """Scale value by {i + 1} and add {i}."""',
                  f"    result = value * scale + {i}", "    return result", ""]
    source = "\n".join(lines)  # 300 lines
    return f"Here is a file:\n\n{source}\nRewrite the whole file, renaming step_7 to stage_7. Output only the file."


PASSAGE = (
    "The harbour town wakes before dawn. Fishermen check their nets by lamplight, and the bakery on the "
    "corner sends the smell of bread down to the water.\n\n"
    "By nine the market is full. Traders call out the prices of mackerel and crab, children run between "
    "the stalls, and the old ferry sounds its horn as it leaves for the island.\n\n"
    "In the afternoon the town is quiet again. The boats rest in the harbour, and the gulls argue over "
    "what the market left behind.")
WORKLOADS = {
    "edit": edit_prompt(),
    "quote": f"{PASSAGE}\n\nQuote the second paragraph exactly, word for word, then summarise the passage.",
    "prose": "Write a long story about a lighthouse keeper who finds a message in a bottle.",
}


def decode_rate(gen, params) -> tuple[float, int]:  # noqa: ANN001 - an Engine, GenerationParams
    """Decode tokens/s of one request alone, and its completion tokens."""
    from exo_p2p.types.chunks import ErrorChunk, FinishChunk, TokenChunk

    gen.submit("bench", params)
    first = end = None
    count = 0
    for _ in range(100_000):
        for chunk in gen.step():
            if isinstance(chunk, TokenChunk) and first is None:
                first = time.perf_counter()
            if isinstance(chunk, ErrorChunk):
                raise RuntimeError(chunk.error.message)
            if isinstance(chunk, FinishChunk):
                end, count = time.perf_counter(), chunk.completion_tokens
        if end is not None:
            break
    assert first is not None and end is not None
    return (count - 1) / max(end - first, 1e-9), count


def batch_rate(gen, params, n: int) -> float:  # noqa: ANN001
    """Aggregate tokens/s of ``n`` requests decoding together (from the first token on)."""
    from exo_p2p.types.chunks import FinishChunk, TokenChunk

    for i in range(n):
        gen.submit(f"b{i}", params[i % len(params)])
    first, done, total = None, 0, 0
    for _ in range(100_000):
        for chunk in gen.step():
            if isinstance(chunk, TokenChunk) and first is None:
                first = time.perf_counter()
            if isinstance(chunk, FinishChunk):
                done, total = done + 1, total + chunk.completion_tokens
        if done == n:
            break
    return total / (time.perf_counter() - (first or 0))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--num-draft", type=int, default=8)
    ap.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=list(WORKLOADS))
    args = ap.parse_args()
    began = time.monotonic()
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

    def params(text: str, max_tokens: int) -> GenerationParams:
        return GenerationParams(messages=(ChatMessage("user", text),), max_tokens=max_tokens, temperature=0.0)

    with tempfile.TemporaryDirectory() as tmp:
        loaded = load_all(import_gguf(find_embedded_gguf(), Path(tmp) / "smollm2"), weights_dtype="float32")
        loaded = dataclasses.replace(loaded, eos_token_ids=loaded.eos_token_ids)

        def engine(spec: str, max_batch: int = 1):  # noqa: ANN202
            return build_engine(loaded, EngineSettings(prefill_chunk_size=256, max_batch=max_batch, prompt_cache_bytes=0,
                                                       speculative=spec, num_draft=args.num_draft))

        llama = "not installed" if shutil.which("llama-server") is None else "on PATH (not driven by this script yet)"
        print(f"load average {os.getloadavg()[0]:.1f}; decode tok/s, median of {args.runs}, alternating; llama-server: {llama}")
        print("| workload | tokens | without | with | with ÷ without | accepted ÷ proposed |")
        print("|---|---|---|---|---|---|")
        for name, text in ((n, WORKLOADS[n]) for n in args.workloads):
            rates: dict[str, list[float]] = {"off": [], "ngram": []}
            counts, acc = set(), ""
            for _ in range(args.runs):
                for spec in ("off", "ngram"):
                    gen = engine(spec)
                    rate, count = decode_rate(gen, params(text, args.max_tokens))
                    rates[spec].append(rate)
                    counts.add(count)
                    if spec == "ngram":
                        s = gen.batch.spec.stats
                        acc = f"{s.accepted}/{s.proposed}"
            off, on = statistics.median(rates["off"]), statistics.median(rates["ngram"])
            print(f"| {name} | {sorted(counts)} | {off:.1f} | {on:.1f} | **{on / off:.2f}×** | {acc} |", flush=True)
        if args.batch > 0:  # --batch 0: single streams only
            mix = [params(t, 64) for t in WORKLOADS.values()]
            agg = {spec: statistics.median(batch_rate(engine(spec, args.batch), mix, args.batch)
                                           for _ in range(args.runs)) for spec in ("off", "ngram")}
            print(f"| batch of {args.batch}, aggregate | 64 each | {agg['off']:.1f} | {agg['ngram']:.1f} | "
                  f"**{agg['ngram'] / agg['off']:.2f}×** | |")
        print(f"load average {os.getloadavg()[0]:.1f} at the end; {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
