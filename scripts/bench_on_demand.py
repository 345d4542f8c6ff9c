"""Time from a first request on an unplaced model (already on disk) to its first token, through
placement on demand, beside the same request once the instance is ready (docs/benchmarks.md
"Placement on demand"). Starts one node on loopback with the embedded model, streams one
greedy chat completion on the unplaced model, then ``--runs`` more on the warm instance.

    .venv/bin/python scripts/bench_on_demand.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.cluster import NodeProcess  # noqa: E402

MODEL = "smollm2-135m-instruct"


def first_token(url: str) -> float:
    """Seconds from sending a streamed chat completion to its first content delta."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8, "temperature": 0, "stream": True}
    start = time.monotonic()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                delta = json.loads(line[6:])["choices"][0]["delta"]
                if delta.get("content"):
                    return time.monotonic() - start
    raise RuntimeError("no token")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        node = NodeProcess(Path(tmp) / "n")
        try:
            node.start()
            cold = first_token(node.url)
            warm = [first_token(node.url) for _ in range(args.runs)]
        finally:
            node.stop()
    print(f"first request on the unplaced {MODEL} (placement on demand, load, first token): {cold:.2f} s")
    print(f"same request, instance ready (median of {args.runs}): {statistics.median(warm):.2f} s")


if __name__ == "__main__":
    main()
