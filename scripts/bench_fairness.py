"""Prefill fairness on a real node: does a long prompt block short ones and running streams?

Starts one ``exo-p2p node`` (``--max-batch 16``, the default ``--prefill-chunk-size``) with a
tiny synthetic model of a long context (``make_synthetic_model``, 64k positions), and
measures, in one run, with each client named by its own ``User-Agent``
(``exo_p2p.api.generation.client_key``):

1. *idle*: TTFT of short requests (``--short-tokens``, default 600) one at a time, nothing
   else running: their own prefill time;
2. *decode alone*: ``--streams`` clients streaming all along; their summed token rate over
   ``--window`` seconds; then short requests' TTFT beside them (*baseline*);
3. *long*: another client's ``--long-tokens`` (default 12k) prompt is sent; the streams' rate
   over ``--window`` seconds while it prefills, then short requests' TTFT while it still
   prefills (*beside*);
4. the long prompt's whole prefill time, and one chunk's time (that ÷ its chunks).

Targets (docs/architecture.md#engine, "Fairness"): a short request beside the long prefill
gets its first token within 2× its own prefill time (idle TTFT p50) plus one chunk; the
streams keep ≥ 0.7 of their rate. The machine's load (``uptime``) is printed with the figures.

    .venv/bin/python scripts/bench_fairness.py [--long-tokens 12000] [--short-tokens 600]
        [--shorts 6] [--streams 2] [--window 6] [--layers 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from exo_p2p.defaults import PREFILL_CHUNK_SIZE  # noqa: E402
from tests.support.models.synthetic_models import make_synthetic_model  # noqa: E402
from tests.support.cluster import NodeProcess, nodes_cleanup, wait_until  # noqa: E402
from tests.support.fair_load import Background, DecodeStream, filler, timed_request  # noqa: E402

MODEL = "long-ctx"


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def shorts(url: str, args: argparse.Namespace, tag: str, until: Background | None = None) -> list[float]:
    """TTFTs of ``args.shorts`` short requests one after the other (stopping early when
    ``until`` was answered: the long prefill ended)."""
    out: list[float] = []
    for i in range(args.shorts):
        if until is not None and until.done:
            break
        took, _ = timed_request(url, MODEL, filler(args.short_tokens, f"{tag}{i}"), "bench-short")
        out.append(took)
    return out


def decode_rate(streams: list[DecodeStream], window: float) -> float:
    start = time.perf_counter()
    time.sleep(window)
    return sum(s.rate(start, start + window) for s in streams)


def measure(url: str, args: argparse.Namespace) -> dict:
    timed_request(url, MODEL, filler(64, "warm"), "bench-warm")
    idle = shorts(url, args, "idle")
    streams = [DecodeStream(url, MODEL, f"bench-decode-{i}").start() for i in range(args.streams)]
    try:
        wait_until(lambda: all(len(s.times) >= 5 for s in streams), 120, what="the streams decoding")
        rate_alone = decode_rate(streams, args.window)
        baseline = shorts(url, args, "base")
        long = Background(url, MODEL, filler(args.long_tokens, "long"), "bench-long")
        time.sleep(1.0)
        rate_long = decode_rate(streams, args.window)
        beside = shorts(url, args, "beside", until=long)
        still_prefilling = not long.done
        long.join(1200)
    finally:
        for s in streams:
            s.stop()
    assert long.took is not None, long.error
    chunk_s = long.took / -(-long.prompt_tokens // PREFILL_CHUNK_SIZE)
    bound = 2 * statistics.median(idle) + chunk_s
    return {
        "short_tokens": args.short_tokens, "long_prompt_tokens": long.prompt_tokens,
        "ttft_idle": {"p50": pct(idle, 0.5), "p95": pct(idle, 0.95)},
        "ttft_with_streams": {"p50": pct(baseline, 0.5), "p95": pct(baseline, 0.95)},
        "ttft_beside_long": {"p50": pct(beside, 0.5), "p95": pct(beside, 0.95), "n": len(beside),
                             "all_sent_while_long_prefilled": still_prefilling},
        "long_prefill_s": long.took, "chunk_s": chunk_s, "bound_s": bound,
        "within_bound": bool(beside) and max(beside) <= bound,
        "decode_tok_s_alone": rate_alone, "decode_tok_s_beside_long": rate_long,
        "decode_ratio": rate_long / rate_alone if rate_alone else None,
        "stream_errors": sum(len(s.errors) for s in streams),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--long-tokens", type=int, default=12_000)
    parser.add_argument("--short-tokens", type=int, default=600)
    parser.add_argument("--shorts", type=int, default=6)
    parser.add_argument("--streams", type=int, default=2)
    parser.add_argument("--window", type=float, default=6.0, help="seconds each decode rate is measured over")
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-fair-") as tmp:
        models = Path(tmp) / "models"
        make_synthetic_model(models / MODEL, n_layers=args.layers, context_length=65_536, seed=3)
        node = NodeProcess(Path(tmp) / "a", extra_args=["--models-dir", str(models), "--max-batch", "16"])
        with nodes_cleanup([node]):
            node.start()
            node.place_and_wait(MODEL, min_nodes=1)
            load_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
            figures = measure(node.url, args)
            figures["uptime_before"] = load_before
            figures["uptime_after"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
