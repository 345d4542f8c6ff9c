"""Structured output's cost in the engine: decode speed of constrained rows against free rows,
the mask time per token and the schema compile time, in this process.

The embedded SmolLM2-135M (float32 weights, the optimised BLAS preloaded as a runner preloads
it), or the tiny synthetic model with ``--synthetic``. For 1 and 16 streams it builds two
engines (``build_engine``) side by side, each with its batch filled: one of free rows, one of
rows constrained by a JSON schema (``SCHEMA``: an array of at least 500 objects, so no row
completes its format), greedy. It then alternates blocks of ``--steps`` decode steps
(``Engine.step``, the block's work finished with ``mx.synchronize``) between the two, the
order flipping each pair, and counts the tokens each block produced: a pair of blocks gives
one ratio, constrained ÷ free tokens/s, and the figures are medians over ``--runs`` pairs.
Blocks of a few steps keep the two sides seconds apart, so other work loading the machine
moves both alike. Free rows have no end-of-turn token, so they too decode every step. Also
printed: CPU milliseconds per token (this process, all threads) and their ratio.

Mask time: every ``Grammars.masks`` call of the constrained blocks (one a step: the batch's
rows together) is timed from outside (the engine's instance method wrapped); p50/p99 per
call and per row-token (a call's time ÷ its rows). Compile time: a matcher built with the
model's tokenizer (``Grammars.constraint``: grammar and matcher) and the API node's check
(``format_problem``), medians of 5, for the bench schema and a schema with ``$defs``,
``anyOf``, ``pattern`` and bounds.

Target (docs/benchmarks.md): constrained ÷ free decode tokens/s ≥ 0.9 at 1 and 16 streams.

    .venv/bin/python scripts/bench_structured.py [--runs 10] [--steps 5] [--synthetic]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MAX_STEPS = 20_000
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}}}
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["people"],
          "properties": {"people": {"type": "array", "items": PERSON, "minItems": 500}}}
"""The bench's format: long enough that no row completes it within a round."""
RICH = {"$defs": {"addr": {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
                                                           "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                           "required": ["city"], "additionalProperties": False}},
        "type": "object", "additionalProperties": False, "required": ["id", "kind", "home"],
        "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 10**6},
                       "kind": {"enum": ["user", "admin", "guest"]},
                       "score": {"type": "number", "minimum": 0, "maximum": 1},
                       "home": {"$ref": "#/$defs/addr"},
                       "contact": {"anyOf": [{"type": "string", "maxLength": 40}, {"type": "null"}]},
                       "items": {"type": "array", "items": {"$ref": "#/$defs/addr"}, "minItems": 1, "maxItems": 4}}}
"""A schema with the keywords a client sends (for the compile time)."""


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def load(synthetic: bool, tmp: Path) -> Any:
    """The bench model: the embedded SmolLM2 (float32) or the tiny synthetic one."""
    from worker.engine.loading.loader import load_all

    if synthetic:
        from tests.support.models.synthetic_models import make_synthetic_model

        return load_all(make_synthetic_model(tmp / "synthetic"))
    from exo_p2p.models.stores.embedded import find_embedded_gguf
    from exo_p2p.models.gguf.importer import import_gguf

    return load_all(import_gguf(find_embedded_gguf(), tmp / "smollm2"), weights_dtype="float32")


class Timed:
    """A ``Grammars.masks`` wrapped to record each call's seconds and rows."""

    def __init__(self, masks: Any, calls: list[tuple[float, int]]) -> None:
        self.masks, self.calls = masks, calls

    def __call__(self, rows: Any) -> Any:
        t0 = time.perf_counter()
        out = self.masks(rows)
        self.calls.append((time.perf_counter() - t0, len(rows)))
        return out


class Filled:
    """An engine whose batch holds ``streams`` decoding rows (free, or constrained by
    ``SCHEMA``), with room for ``steps`` more decode steps; counts the tokens it produces."""

    def __init__(self, loaded: Any, streams: int, constrained: bool, steps: int) -> None:
        from exo_p2p.types.engine import EngineSettings
        from exo_p2p.types.tasks import ChatMessage, GenerationParams, OutputFormat
        from worker.engine.builder import build_engine

        self.streams, self.produced = streams, 0
        self.gen = build_engine(loaded, EngineSettings(prefill_chunk_size=256, max_batch=streams),
                                on_token=self._count)
        fmt = OutputFormat("json_schema", json.dumps(SCHEMA), name="people") if constrained else None
        for i in range(streams):
            self.gen.submit(f"t{i}", GenerationParams(
                messages=(ChatMessage("user", f"List people, as JSON, group {i}."),),
                max_tokens=steps + 100, temperature=0.0, output_format=fmt))
        if self.gen.grammars is not None:
            self.gen.grammars.tokenizer()  # built in the background: wait, outside the windows
        for _ in range(MAX_STEPS):
            if len(self.gen.batch.rows) == streams and not self.gen.in_prefill and not self.gen.queued_task_ids:
                break
            self.gen.step()
        for _ in range(3):
            self.gen.step()

    def _count(self, _task: Any, _token: int) -> None:
        self.produced += 1

    def block(self, steps: int) -> tuple[float, float, int]:
        """``steps`` decode steps, their work finished: (seconds, CPU seconds, tokens)."""
        import mlx.core as mx

        before = self.produced
        t0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            self.gen.step()
        mx.synchronize()
        if len(self.gen.batch.rows) != self.streams:
            raise RuntimeError(f"a row ended inside a window ({len(self.gen.batch.rows)} of {self.streams} left)")
        return time.perf_counter() - t0, time.process_time() - cpu0, self.produced - before


def overhead(con: Filled, free_step: float, calls: list[tuple[float, int]], repeats: int = 20) -> dict[str, float]:
    """What a constrained step adds to a free one, each part timed on its own (milliseconds,
    medians), and the decode ratio they imply beside ``free_step`` (a free step's seconds):
    the masks (``calls``), the grammars' advance by one token, and the masked per-row draw
    against the one ``argmax`` of free rows, on the same evaluated log-probabilities."""
    import mlx.core as mx

    from worker.engine.pipeline import sample_rows

    rows = con.gen.batch.rows
    samplers = [row.sampler for row in rows]
    logprobs = mx.random.normal((len(rows), int(samplers[0].mask.shape[-1])))  # type: ignore[union-attr]
    mx.eval(logprobs, *[s.mask for s in samplers])
    free_draw, masked_draw = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        mx.eval(mx.argmax(logprobs, axis=-1))
        free_draw.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        mx.eval(sample_rows(samplers, logprobs))
        masked_draw.append(time.perf_counter() - t0)
    advance = []
    for _ in range(repeats):  # a clone of each row's matcher, fed the token its mask allows first
        clones = [row.constraint.matcher.deep_copy() for row in rows]  # type: ignore[union-attr]
        allowed = [int(mx.argmax(s.mask[0]).item()) for s in samplers]  # type: ignore[index]
        t0 = time.perf_counter()
        for matcher, token in zip(clones, allowed, strict=True):
            matcher.consume_token(token)
        advance.append(time.perf_counter() - t0)
    med = statistics.median
    parts = {"masks": pct([c for c, _n in calls], 0.5) * 1e3, "advance": med(advance) * 1e3,
             "draw": (med(masked_draw) - med(free_draw)) * 1e3}
    parts["implied ratio"] = free_step * 1e3 / (free_step * 1e3 + sum(parts.values()))
    return parts


def compile_times(loaded: Any) -> dict[str, tuple[float, float]]:
    """Per schema: (matcher built with the tokenizer, the API node's check), median seconds."""
    from exo_p2p.content.output_format import format_problem
    from exo_p2p.types.tasks import OutputFormat
    from worker.engine.prepare import new_grammars

    grammars = new_grammars(loaded)
    grammars.tokenizer()
    out = {}
    for name, schema in (("bench (minItems 500)", SCHEMA), ("$defs/anyOf/pattern", RICH), ("json_object", None)):
        fmt = OutputFormat("json_object") if schema is None else OutputFormat("json_schema", json.dumps(schema))
        built, checked = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            grammars.constraint(fmt, [1, 2, 3])
            built.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assert format_problem(fmt) is None
            checked.append(time.perf_counter() - t0)
        out[name] = (statistics.median(built), statistics.median(checked))
    return out


def pairs(loaded: Any, free: Any, streams: int, runs: int, steps: int) -> tuple[list, list, list, dict]:
    """``runs`` pairs of blocks of ``steps`` steps, a free and a constrained engine alive
    side by side (the order flips each pair): per pair (free, constrained) tokens/s and CPU
    ms per token; the constrained blocks' mask calls; and ``overhead``'s parts."""
    engines = {False: Filled(free, streams, False, runs * steps + 10),
               True: Filled(loaded, streams, True, runs * steps + 10)}
    calls: list[tuple[float, int]] = []
    grammars = engines[True].gen.grammars
    assert grammars is not None
    grammars.masks = Timed(grammars.masks, calls)  # type: ignore[method-assign]
    rates, cpus, free_steps = [], [], []
    for run in range(runs):
        got = {}
        for c in ((False, True) if run % 2 == 0 else (True, False)):
            seconds, cpu, tokens = engines[c].block(steps)
            got[c] = (tokens / seconds, cpu * 1e3 / tokens)
            if not c:
                free_steps.append(seconds / steps)
        rates.append((got[False][0], got[True][0]))
        cpus.append((got[False][1], got[True][1]))
        print(f"  {streams:>2} streams pair {run + 1}: free {rates[-1][0]:.1f} tok/s ({cpus[-1][0]:.1f} CPU ms/token), "
              f"constrained {rates[-1][1]:.1f} tok/s ({cpus[-1][1]:.1f}), ratio {rates[-1][1] / rates[-1][0]:.3f} "
              f"(load {os.getloadavg()[0]:.1f})", flush=True)
    return rates, cpus, calls, overhead(engines[True], statistics.median(free_steps), calls)


def bench(loaded: Any, free: Any, sizes: list[int], runs: int, steps: int) -> None:
    """Alternating blocks per size (``free``: ``loaded`` with no end-of-turn token, for the
    free rows); prints each pair, then the medians and the overhead's parts."""
    print(f"load average {os.getloadavg()[0]:.1f}; blocks of {steps} steps, greedy")
    rows, parts = [], []
    for streams in sizes:
        rates, cpus, calls, extra = pairs(loaded, free, streams, runs, steps)
        med = statistics.median
        per_call = [s * 1e3 for s, _n in calls]
        per_row = [s * 1e3 / n for s, n in calls]
        rows.append(f"| {streams} | {med(f for f, _c in rates):.1f} | {med(c for _f, c in rates):.1f} | "
                    f"**{med(c / f for f, c in rates):.3f}** | {med(f / c for f, c in cpus):.3f} | "
                    f"{pct(per_call, 0.5):.2f} / {pct(per_call, 0.99):.2f} | "
                    f"{pct(per_row, 0.5):.3f} / {pct(per_row, 0.99):.3f} | {len(calls)} |")
        parts.append(f"| {streams} | {extra['masks']:.2f} | {extra['advance']:.2f} | {extra['draw']:.2f} | "
                     f"{extra['implied ratio']:.3f} |")
    print("\n| streams | free tok/s | constrained tok/s | ratio (median of pairs) | CPU ratio (free ÷ constrained"
          " CPU per token) | mask ms/step p50 / p99 | mask ms/row-token p50 / p99 | mask calls |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\nWhat a constrained step adds, ms (medians), and the ratio it implies beside a free step:")
    print("| streams | masks | grammar advance | masked draw − argmax | implied ratio |")
    print("|---|---|---|---|---|")
    print("\n".join(parts))


def main() -> int:
    """Parse the options, re-run with the BLAS preloaded, bench, print."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10, help="pairs of blocks per size")
    ap.add_argument("--steps", type=int, default=5, help="decode steps per block")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--synthetic", action="store_true", help="the tiny synthetic model instead of SmolLM2")
    args = ap.parse_args()
    from worker import blas

    if "EXO_P2P_PROFILE_CHILD" not in os.environ:  # re-run with the BLAS preloaded
        env = blas.runner_environment(dict(os.environ), blas.find_optimised_blas(), blas.offered_cores())
        env["EXO_P2P_PROFILE_CHILD"] = "1"
        return subprocess.call([sys.executable, *sys.argv], env=env)
    with tempfile.TemporaryDirectory() as tmp:
        loaded = load(args.synthetic, Path(tmp))
        free = dataclasses.replace(loaded, eos_token_ids=frozenset())
        print("schema compile, median of 5 (matcher with the tokenizer / the API node's check):")
        for name, (built, checked) in compile_times(loaded).items():
            print(f"  {name}: {built * 1e3:.1f} ms / {checked * 1e3:.1f} ms")
        bench(loaded, free, args.sizes, args.runs, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
