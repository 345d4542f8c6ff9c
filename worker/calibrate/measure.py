"""The calibration itself, run in a subprocess of the node (the node process never imports
MLX: tests/test_startup_imports.py): ``python -m worker.calibrate.measure`` prints one JSON
line ``{"decode_ns_per_kib": .., "prefill_ns_per_kib": .., "mem_mib_per_s": ..}``.

A tiny synthetic transformer layer at SmolLM2's shapes (hidden 576, MLP 1536, 3 kv heads of
64), float32 weights as a CPU runner holds them: one decode step is its matmuls on one row,
a prefill its matmuls on ``PREFILL_TOKENS`` rows; memory bandwidth a ``MEM_MIB`` MiB sum.
Each is timed over wall-clock windows (``WINDOW_S``), not per call, so a CPU quota (a
cgroup, a busy machine) shows in the figure as it shows in a runner's. About 1.5 s of CPU
with MLX's import (docs/placement-speed.md "Calibration").
"""

from __future__ import annotations

import json
import time

HIDDEN, MLP, KV = 576, 1536, 192
PREFILL_TOKENS = 64
MEM_MIB = 64
WINDOW_S = {"decode": 0.4, "prefill": 0.3, "mem": 0.2}
"""Wall-clock seconds each figure is timed over (a few 100 ms CPU-quota periods)."""
MAX_CALLS = 100_000
"""Calls per window at most (a bound on the loop whatever the clock says)."""


def timed(fn, window: float) -> float:  # type: ignore[no-untyped-def]
    """Seconds per call of ``fn`` over at least ``window`` s of wall clock (after one warm-up)."""
    fn()
    calls, start = 0, time.perf_counter()
    while calls < MAX_CALLS:
        fn()
        calls += 1
        if time.perf_counter() - start >= window:
            break
    return (time.perf_counter() - start) / calls


def measure() -> dict[str, int]:
    """The three figures (module docstring), rounded to ints."""
    import mlx.core as mx

    mx.random.seed(0)
    shapes = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN), (MLP, HIDDEN), (MLP, HIDDEN), (HIDDEN, MLP)]
    weights = [mx.random.normal(s) * 0.02 for s in shapes]
    mx.eval(weights)
    kib = sum(w.size * 4 for w in weights) / 1024

    def layer(rows: int):  # type: ignore[no-untyped-def]
        x = mx.random.normal((rows, HIDDEN))
        mx.eval(x)

        def step() -> None:
            q, k, v = (x @ w.T for w in weights[:3])
            h = (q * 0.5) @ weights[3].T + x
            gate, up = h @ weights[4].T, h @ weights[5].T
            mx.eval((gate * mx.sigmoid(gate) * up) @ weights[6].T + h, k, v)

        return step

    decode = timed(layer(1), WINDOW_S["decode"])
    prefill = timed(layer(PREFILL_TOKENS), WINDOW_S["prefill"])
    big = mx.ones((MEM_MIB << 18,), dtype=mx.float32)
    mx.eval(big)
    mem = timed(lambda: mx.eval(mx.sum(big)), WINDOW_S["mem"])
    return {"decode_ns_per_kib": round(decode * 1e9 / kib), "prefill_ns_per_kib": round(prefill * 1e9 / kib / PREFILL_TOKENS),
            "mem_mib_per_s": round(MEM_MIB / mem)}


if __name__ == "__main__":
    print(json.dumps(measure()), flush=True)
