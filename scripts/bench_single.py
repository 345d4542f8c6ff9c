"""Single-node speed: our API vs raw mlx-lm on the same weights, measured side by side.

Alternates (a) mlx-lm ``stream_generate`` in this process and (b) a streaming chat
completion through a real ``exo-p2p node`` (started here, stopped at the end), ``--runs``
times each, and prints medians and the ratios of decode tokens/s
(``completion_tokens / (t_last − t_first)``) and TTFT (request start → first token).
Targets (docs/benchmarks.md): decode ratio ≥ 0.95, TTFT ratio ≤ 1.05.

    .venv/bin/python scripts/bench_single.py [--runs 7] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.support.cluster import NodeProcess  # noqa: E402

MODEL = "smollm2-135m-instruct"
PROMPT = "Write a short story about a robot who learns to paint."


def bench_raw(model, tokenizer, max_tokens: int) -> tuple[float, float, int]:
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    messages = [{"role": "user", "content": PROMPT}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(prompt, dict):  # transformers 5 may return a BatchEncoding
        prompt = prompt["input_ids"]
    t0 = time.perf_counter()
    t_first = t_last = 0.0
    n = 0
    for response in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens, sampler=make_sampler(temp=0.0)):
        now = time.perf_counter()
        if n == 0:
            t_first = now
        t_last = now
        n = response.generation_tokens
    return t_first - t0, n / (t_last - t_first) if t_last > t_first else 0.0, n


def bench_api(url: str, max_tokens: int) -> tuple[float, float, int]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "temperature": 0, "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    t_first = t_last = 0.0
    completion = 0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"the API streamed an error: {chunk['error']}")
            if chunk.get("usage"):
                completion = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                if not t_first:
                    t_first = now
                t_last = now
    return t_first - t0, completion / (t_last - t_first) if t_last > t_first else 0.0, completion


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        node = NodeProcess(Path(tmp) / "node")
        try:
            node.start()
            node.place_and_wait(MODEL, timeout=600)
            from mlx_lm import load

            model_dir = Path(tmp) / "node" / "models" / MODEL
            model, tokenizer = load(str(model_dir))
            bench_raw(model, tokenizer, 4)  # warm up both sides once
            bench_api(node.url, 4)
            raw, ours = [], []
            for i in range(args.runs):
                raw.append(bench_raw(model, tokenizer, args.max_tokens))
                ours.append(bench_api(node.url, args.max_tokens))
                print(f"run {i + 1}: raw ttft {raw[-1][0]:.3f}s {raw[-1][1]:.2f} tok/s ({raw[-1][2]} tok) | "
                      f"api ttft {ours[-1][0]:.3f}s {ours[-1][1]:.2f} tok/s ({ours[-1][2]} tok)", flush=True)
        finally:
            node.stop()
    med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
    print(f"\nmedian over {args.runs} runs, max_tokens={args.max_tokens}, prompt {PROMPT!r}")
    print(f"  raw mlx-lm : TTFT {med(raw, 0):.3f} s, decode {med(raw, 1):.2f} tokens/s")
    print(f"  exo-p2p API: TTFT {med(ours, 0):.3f} s, decode {med(ours, 1):.2f} tokens/s")
    print(f"  decode ratio (ours/raw): {med(ours, 1) / med(raw, 1):.3f}   (target >= 0.95)")
    print(f"  TTFT ratio   (ours/raw): {med(ours, 0) / med(raw, 0):.3f}   (target <= 1.05)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
