"""One model, three engines side by side on this machine: prefill tok/s, decode tok/s, TTFT.

Columns, each run in its own fresh process (a BLAS can only be chosen before MLX loads):

- **today** — raw mlx-lm ``stream_generate`` on the stored (quantized) weights with MLX's
  own BLAS: the engine without the CPU-weights path (on Linux the ``mlx[cpu]`` wheel's reference BLAS);
- **ours** — this project's engine (``worker.engine.builder.build_engine``) on weights loaded the way a CPU runner loads them
  (``--weights float32``: expanded at load) with the optimised BLAS preloaded as the
  supervisor does (``worker.blas.runner_environment``: ``LD_PRELOAD`` + ``OPENBLAS_NUM_THREADS``);
- **llama.cpp** — ``llama-cpp-python`` on the same GGUF (the embedded model's), when it is
  installed. It is a benchmark-only extra, never a dependency of the node or the tests, and
  installing it builds llama.cpp from source (``pip install -e '.[bench]'`` or ``pip install
  llama-cpp-python``: many minutes on 2 cores); without it the column says "not installed".

Each engine gets the same chat prompt (greedy, end-of-turn ignored so every run decodes
exactly ``--max-tokens``), ``--runs`` times after one warm-up, the engines' runs alternating
(the processes stay up between runs) so load from other work drifts over all of them alike;
the medians are printed.
TTFT: seconds from the call (chat template included) to the first token; prefill tok/s:
prompt tokens ÷ TTFT; decode tok/s: ``(n − 1) / (t_last − t_first)``. Then the ratios
ours ÷ today (targets: prefill ≥ 10×, decode ≥ 1.8×) and ours ÷ llama.cpp.

    .venv/bin/python scripts/bench_engine.py                  # the embedded SmolLM2-135M
    .venv/bin/python scripts/bench_engine.py --runs 1 --max-tokens 24   # short
    .venv/bin/python scripts/bench_engine.py --model-dir DIR  # any MLX model dir (no llama.cpp column)
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPT = (
    "Here are some notes about the sky. During the day the sky looks blue because sunlight is "
    "scattered by the molecules of the air, and blue light is scattered much more than red "
    "light. At sunset the light crosses much more air before it reaches us, so most of the "
    "blue is scattered away and the remaining light looks orange and red. Clouds look white "
    "because their droplets scatter every colour about equally. On the Moon there is no air, "
    "so the sky is black even in daytime. Using these notes, explain in a few short "
    "paragraphs why the sky is blue during the day and red at sunset, and what Rayleigh "
    "scattering has to do with it."
)
ENGINES = ("today", "ours", "llama.cpp")


# --- the engines (each in its own process) ------------------------------------------------------

def _timed(first_and_times: list[float], t0: float, prompt_tokens: int) -> dict:
    times = first_and_times
    ttft = times[0] - t0
    decode = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
    return {"ttft": ttft, "prefill_tps": prompt_tokens / ttft, "decode_tps": decode, "tokens": len(times),
            "prompt_tokens": prompt_tokens}


def run_today(model_dir: Path, max_tokens: int, chunk: int) -> Iterator[dict]:
    from mlx_lm.generate import stream_generate

    from worker.engine.loading.loader import load_all

    loaded = load_all(model_dir)  # stored weights, MLX's own BLAS: the engine without the CPU-weights path
    tok = copy.copy(loaded.tokenizer)
    tok.eos_token_ids = set()
    while True:
        t0 = time.perf_counter()
        ids = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True)
        times: list[float] = []
        for _ in stream_generate(loaded.model, tok, ids, max_tokens=max_tokens, prefill_step_size=chunk):
            times.append(time.perf_counter())
        yield _timed(times, t0, len(ids))


def run_ours(model_dir: Path, max_tokens: int, chunk: int, weights: str) -> Iterator[dict]:
    from exo_p2p.types.chunks import TokenChunk
    from exo_p2p.types.engine import EngineSettings
    from exo_p2p.types.tasks import ChatMessage, GenerationParams
    from worker.engine.builder import build_engine
    from worker.engine.loading.loader import load_all

    loaded = load_all(model_dir, weights_dtype=weights)
    prompt_tokens = len(loaded.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True))
    for i in itertools.count():
        gen = build_engine(dataclasses.replace(loaded, eos_token_ids=frozenset()), EngineSettings(prefill_chunk_size=chunk))
        t0 = time.perf_counter()
        gen.submit(f"bench-{i}", GenerationParams(messages=(ChatMessage("user", PROMPT),), max_tokens=max_tokens, temperature=0))
        times: list[float] = []
        for _ in range(100_000):
            if not gen.has_work():
                break
            for c in gen.step():
                if isinstance(c, TokenChunk):
                    times.append(time.perf_counter())
        yield _timed(times, t0, prompt_tokens)


def run_llama_cpp(gguf: Path, max_tokens: int, threads: int) -> Iterator[dict]:
    from llama_cpp import Llama  # the optional benchmark extra

    llm = Llama(model_path=str(gguf), n_ctx=2048, n_threads=threads, n_batch=512, verbose=False)
    while True:
        t0 = time.perf_counter()
        ids = llm.tokenize(("<|im_start|>user\n" + PROMPT + "<|im_end|>\n<|im_start|>assistant\n").encode(), special=True)
        llm.reset()
        times: list[float] = []
        for _ in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            times.append(time.perf_counter())
            if len(times) >= max_tokens:
                break
        yield _timed(times, t0, len(ids))


def child(args: argparse.Namespace) -> None:
    """Load, then one timed run per line read on stdin, one JSON line out per run."""
    if args.child == "today":
        runs = run_today(args.model_dir, args.max_tokens, args.prefill_chunk_size)
    elif args.child == "ours":
        runs = run_ours(args.model_dir, args.max_tokens, args.prefill_chunk_size, args.weights)
    else:
        runs = run_llama_cpp(args.gguf, args.max_tokens, args.threads)
    from worker.blas import loaded_blas_libraries

    print(json.dumps({"ready": True}), flush=True)
    for _ in sys.stdin:
        result = next(runs)
        # the BLAS libraries mapped, but numpy's own (symbols prefixed, MLX never calls it)
        result["blas"] = [Path(p).name for p in loaded_blas_libraries() if "scipy_openblas" not in p]
        print(json.dumps(result), flush=True)


# --- the parent ----------------------------------------------------------------------------------

class Engine:
    """One engine's process (``--child``): ``run()`` asks it for one timed run."""

    def __init__(self, engine: str, args: argparse.Namespace, model_dir: Path, gguf: Path | None, env: dict[str, str]) -> None:
        cmd = [sys.executable, __file__, "--child", engine, "--model-dir", str(model_dir),
               "--max-tokens", str(args.max_tokens), "--prefill-chunk-size", str(args.prefill_chunk_size),
               "--weights", args.weights, "--threads", str(args.threads)]
        if gguf is not None:
            cmd += ["--gguf", str(gguf)]
        self.name = engine
        self.proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self.error: str | None = None
        self.runs: list[dict] = []
        self._read()

    def _read(self) -> dict | None:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            self.error = f"failed (exit {self.proc.wait()})"
            return None
        return json.loads(line)

    def run(self, keep: bool = True) -> None:
        if self.error is not None:
            return
        assert self.proc.stdin is not None
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        result = self._read()
        if result is not None and keep:
            self.runs.append(result)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def main() -> None:
    from worker import blas

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, default=None, help="MLX model dir (default: the embedded SmolLM2, imported to a temp dir)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--prefill-chunk-size", type=int, default=256)
    ap.add_argument("--weights", choices=("float32", "stored"), default="float32", help="what 'ours' loads (default float32)")
    ap.add_argument("--threads", type=int, default=blas.offered_cores(), help="BLAS / llama.cpp threads (default: the cores offered)")
    ap.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    ap.add_argument("--gguf", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return

    library = blas.find_optimised_blas()
    plain = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "OPENBLAS_NUM_THREADS")}
    with tempfile.TemporaryDirectory() as tmp:
        gguf: Path | None = None
        model_dir = args.model_dir
        if model_dir is None:
            from exo_p2p.models.stores.embedded import find_embedded_gguf
            from exo_p2p.models.gguf.importer import import_gguf

            gguf = find_embedded_gguf()
            model_dir = import_gguf(gguf, Path(tmp) / "smollm2")
        print(f"model {model_dir.name}, {args.max_tokens} new tokens, prefill chunk {args.prefill_chunk_size}, "
              f"{args.runs} runs + 1 warm-up each; ours: {args.weights} weights, BLAS "
              f"{library if library else 'none found (' + blas.INSTALL_COMMAND + ')'}, {args.threads} threads")
        engines: list[Engine] = []
        notes: dict[str, str] = {}
        try:
            engines.append(Engine("today", args, model_dir, gguf, plain))
            engines.append(Engine("ours", args, model_dir, gguf, blas.runner_environment(plain, library, args.threads)))
            import importlib.util

            if gguf is None:
                notes["llama.cpp"] = "no GGUF (--model-dir given)"
            elif importlib.util.find_spec("llama_cpp") is None:
                notes["llama.cpp"] = "not installed (pip install llama-cpp-python: builds llama.cpp)"
            else:
                engines.append(Engine("llama.cpp", args, model_dir, gguf, plain))
            for engine in engines:  # warm-up, not counted
                engine.run(keep=False)
            for i in range(args.runs):  # alternate, so drifting load from other work hits all alike
                for engine in engines if i % 2 == 0 else engines[::-1]:
                    engine.run()
        finally:
            for engine in engines:
                engine.close()
        results: dict[str, dict | str] = {e.name: e.error if e.error else {"runs": e.runs, "blas": e.runs[-1]["blas"]}
                                          for e in engines if e.error or e.runs}
        results.update(notes)

    medians: dict[str, dict[str, float]] = {}
    print(f"\n{'engine':<10} {'prefill tok/s':>14} {'decode tok/s':>13} {'TTFT s':>8}  BLAS / note")
    for engine in ENGINES:
        r = results.get(engine, "no runs")
        if isinstance(r, str):
            print(f"{engine:<10} {'-':>14} {'-':>13} {'-':>8}  {r}")
            continue
        m = {k: statistics.median(run[k] for run in r["runs"]) for k in ("prefill_tps", "decode_tps", "ttft")}
        medians[engine] = m
        print(f"{engine:<10} {m['prefill_tps']:>14.1f} {m['decode_tps']:>13.1f} {m['ttft']:>8.3f}  "
              f"{', '.join(r['blas']) or '-'} (prompt {r['runs'][0]['prompt_tokens']} tokens)")
    if "ours" in medians:
        for other, targets in (("today", " (targets: prefill >= 10, decode >= 1.8)"), ("llama.cpp", "")):
            if other in medians:
                o, t = medians["ours"], medians[other]
                print(f"ours / {other}: prefill {o['prefill_tps'] / t['prefill_tps']:.2f}x, decode "
                      f"{o['decode_tps'] / t['decode_tps']:.2f}x, TTFT {o['ttft'] / t['ttft']:.3f}{targets}")


if __name__ == "__main__":
    main()
