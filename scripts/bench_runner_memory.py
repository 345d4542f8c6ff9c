"""A runner's memory over many requests: RSS of the runner of one node with a tiny synthetic
model placed, sampled along ``N`` chat requests sent one after the other.

    .venv/bin/python scripts/bench_runner_memory.py 500 distinct        # a new JSON schema each
    .venv/bin/python scripts/bench_runner_memory.py 500 same            # one schema
    .venv/bin/python scripts/bench_runner_memory.py 500 plain           # no structured output
    .venv/bin/python scripts/bench_runner_memory.py 500 distinct --prompt-cache-bytes 0

Prints one JSON line: the requests that did not answer 200 and ``[requests, runner RSS MiB]``
pairs. Each request's prompt differs, so with the prompt cache on (the node's default) every
answered conversation's KV is kept up to the cache's bound (docs/security.md#model-sources).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.models.synthetic_models import make_synthetic_model  # noqa: E402
from tests.support.cluster import NodeProcess, nodes_cleanup  # noqa: E402

SAMPLES = (1, 20, 50, 100, 200, 300, 400, 500, 1000)


def schema(i: int, kind: str) -> dict:
    """Request ``i``'s JSON schema: four short strings, named per request for ``distinct``."""
    props = {(f"k{i}_{j}" if kind == "distinct" else f"k{j}"): {"type": "string", "maxLength": 8} for j in range(4)}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("requests", type=int)
    parser.add_argument("kind", choices=["distinct", "same", "plain"])
    parser.add_argument("--prompt-cache-bytes", default=None)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-runner-memory-"))
    make_synthetic_model(base / "models" / "tiny")
    extra = ["--models-dir", str(base / "models")]
    if args.prompt_cache_bytes is not None:
        extra += ["--prompt-cache-bytes", args.prompt_cache_bytes]
    with nodes_cleanup([]) as nodes:
        node = NodeProcess(base / "n", extra_args=extra)
        nodes.append(node.start())
        node.place_and_wait("tiny")
        samples, failed, start = [], 0, time.time()
        with httpx.Client(timeout=120) as client:
            for i in range(args.requests):
                body = {"model": "tiny", "max_tokens": 40, "messages": [{"role": "user", "content": f"q {i}"}]}
                if args.kind != "plain":
                    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema(i, args.kind)}}
                failed += client.post(node.url + "/v1/chat/completions", json=body).status_code != 200
                if i + 1 in SAMPLES or i + 1 == args.requests:
                    rss = max(c.memory_info().rss for c in node.children()) / 2**20
                    samples.append((i + 1, round(rss, 1)))
    print(json.dumps({"kind": args.kind, "prompt_cache_bytes": args.prompt_cache_bytes, "non_200": failed,
                      "runner_rss_mib": samples, "seconds": round(time.time() - start, 1)}))


if __name__ == "__main__":
    main()
