"""Pipeline benchmark: decode tokens/s and TTFT for 1, 2 and 3 ranks on this machine, in one
run, with the ratio to 1 rank and each rank's peak memory during load; with ``--requests N``
(N > 1), N requests at once in one batch, aggregate tokens/s and where each rank's time goes.

    python scripts/bench_pipeline.py [--model-dir DIR] [--ranks 1 2 3] [--max-tokens 64]
        [--requests 16 [--micro-batches M] [--waits on|off ...] [--threads T] [--pin] [--profile]]

Without ``--model-dir`` a synthetic llama model (random weights; ``--layers``/``--hidden``)
is written to a temp dir. Ranks are processes on 127.0.0.1 joined by MLX's ring backend
(worker/engine/distributed.py); each runs the engine (``build_engine``) with a PipelineStage. Greedy
decoding; the same prompt for every world size; the first request of each run is a warm-up
and is not measured. Every process is killed at the end. ``--waits``: whether the ranks wait
for their neighbours asleep (``worker.engine.ring_wait``, as the runner's pipeline ranks do) or
in MLX's spinning receive; each rank's CPU seconds over the measured phase are printed.

Where the time goes (``--profile``, ``--requests`` > 1, 2+ ranks): a second, profiled run whose stage
evaluates each part of a step on its own (``TimedStage``: no overlap between Python and the
model then, so its tokens/s is lower than the plain run's), summed over the measured phase per
rank: ``compute`` (this rank's layers, embedding or head), ``recv`` (rank > 0: waiting for the
previous rank's hidden states, i.e. its compute, plus the transfer), ``send``, ``tokens`` (the
all-sum that hands every rank the sampled tokens: on rank 0 the wait for the later ranks),
and ``python`` (the step's wall time minus those: scheduling, detokenizing, stop strings).
``transfer`` is a ping-pong of one decode step's hidden states ``[N, 1, hidden]`` between
ranks 0 and 1 after the run (one way, median of 50).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPT = "Tell me a long story about a lighthouse keeper and the sea. " * 3


def timed_stage_class():
    """``PipelineStage`` that evaluates each part of a step on its own and sums its seconds
    per part in ``times`` (see the module docstring)."""
    import mlx.core as mx

    from worker.engine.pipeline import PipelineStage, _layers_of, head, logprobs_of, run_layers

    class TimedStage(PipelineStage):
        times: dict[str, float] = {}

        def _timed(self, key: str, x):
            t = time.perf_counter()
            mx.eval(x)
            self.times[key] = self.times.get(key, 0.0) + time.perf_counter() - t
            return x

        def _hidden(self, model, tokens, cache):
            if self.is_first:
                h = self._timed("compute", _layers_of(model).embed_tokens(tokens))
            else:
                like = mx.zeros((tokens.shape[0], tokens.shape[1], self.hidden_size), dtype=self.hidden_dtype)
                h = self._timed("recv", mx.distributed.recv_like(like, self.rank - 1, group=self.group))
            h = self._timed("compute", run_layers(model, h, cache))
            if not self.is_last:
                if self.wire_dtype is not None:
                    h = h.astype(self.wire_dtype)
                h = self._timed("send", mx.distributed.send(h, self.rank + 1, group=self.group))
            return h

        def forward_last(self, model, tokens, cache):
            h = self._hidden(model, tokens, cache)
            return self._timed("compute", logprobs_of(head(model, h))) if self.is_last else h

        def sample(self, pending, samplers):
            return self._timed("tokens", super().sample(pending, samplers))

    return TimedStage


def ping_pong(group, shape: tuple[int, ...], rounds: int = 50) -> float:
    """One-way seconds (median) of ``shape`` float32 between ranks 0 and 1 (others idle)."""
    import mlx.core as mx

    rank, times = group.rank(), []
    x = mx.zeros(shape, dtype=mx.float32)
    for _ in range(rounds):
        t = time.perf_counter()
        if rank == 0:
            mx.eval(mx.distributed.send(x, 1, group=group))
            mx.eval(mx.distributed.recv_like(x, 1, group=group))
        elif rank == 1:
            mx.eval(mx.distributed.recv_like(x, 0, group=group))
            mx.eval(mx.distributed.send(x, 0, group=group))
        times.append((time.perf_counter() - t) / 2)
    return sorted(times)[len(times) // 2]


def rank_main(cfg: dict) -> dict:
    """One rank: join the ring, load its layers, run a warm-up then the measured requests
    (``cfg["requests"]`` at once, one batch)."""
    from exo_p2p.types.chunks import FinishChunk
    from exo_p2p.types.engine import EngineSettings
    from exo_p2p.types.tasks import ChatMessage, GenerationParams
    from worker.engine.builder import build_engine
    from worker.engine.distributed import init_ring
    from worker.engine.loading.loader import load_all
    from worker.engine.pipeline import PipelineStage, probe_hidden_dtype
    from worker.engine.ring_wait import NO_WAIT, ring_wait

    group = None
    if cfg["world_size"] > 1:
        group = init_ring(cfg["addresses"], cfg["rank"], cfg["world_size"])
    loaded = load_all(cfg["model_dir"], start_layer=cfg["start"], end_layer=cfg["end"])
    stage = None
    n = cfg["requests"]
    if group is not None:
        c = loaded.config.get("text_config", loaded.config)
        kind = timed_stage_class() if cfg["profile"] else PipelineStage
        wait = ring_wait(cfg["addresses"], cfg["rank"]) if cfg["wait"] else NO_WAIT
        stage = kind(group, int(c["hidden_size"]), probe_hidden_dtype(loaded.model, group, int(c["hidden_size"])),
                     wait=wait)
    extra = {"micro_batches": cfg["micro"]} if cfg["micro"] is not None else {}
    gen = build_engine(loaded, EngineSettings(prefill_chunk_size=cfg["chunk"], max_batch=max(1, n), **extra),
                       stage=stage)
    results: dict = {}
    step_wall = 0.0
    for phase, count, max_tokens in (("warmup", 1, 4), ("measured", n, cfg["max_tokens"])):
        for i in range(count):
            gen.submit(f"{phase}{i}", GenerationParams(messages=(ChatMessage("user", f"{i} {PROMPT}"),),
                                                       max_tokens=max_tokens, temperature=0.0))
        if phase == "measured" and stage is not None and cfg["profile"]:
            stage.times.clear()
        t0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(100_000):
            if not gen.has_work():
                break
            for chunk in gen.step():
                if isinstance(chunk, FinishChunk):
                    results[chunk.task_id] = chunk
        step_wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    measured = [results[f"measured{i}"] for i in range(n)]
    out = {"rank": cfg["rank"], "ttft": measured[0].ttft, "tps": measured[0].decode_tokens_per_second,
           "aggregate_tps": sum(f.completion_tokens for f in measured) / step_wall, "wall": step_wall,
           "completion_tokens": sum(f.completion_tokens for f in measured), "prompt_tokens": measured[0].prompt_tokens,
           "peak_memory_bytes": loaded.peak_memory_bytes, "cpu": cpu,
           "wait_timeouts": stage.wait.timeouts if stage is not None else 0}
    if stage is not None and cfg["profile"]:
        out["times"] = {**stage.times, "python": step_wall - sum(stage.times.values())}
        c = loaded.config.get("text_config", loaded.config)
        out["transfer"] = ping_pong(group, (max(1, n), 1, int(c["hidden_size"])))
    return out


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def split(n_layers: int, world: int) -> list[tuple[int, int]]:
    base, extra = divmod(n_layers, world)
    out, start = [], 0
    for r in range(world):
        end = start + base + (1 if r < extra else 0)
        out.append((start, end))
        start = end
    return out


def run_world(model_dir: Path, n_layers: int, world: int, args: argparse.Namespace, profile: bool = False,
              micro: int | None = None, wait: bool = True) -> list[dict]:
    from worker import blas

    env = blas.runner_environment(os.environ, blas.find_optimised_blas(), args.threads)
    addresses = [f"127.0.0.1:{p}" for p in free_ports(world)]
    procs = []
    try:
        for rank, (start, end) in enumerate(split(n_layers, world)):
            cfg = {"model_dir": str(model_dir), "rank": rank, "world_size": world, "start": start, "end": end,
                   "addresses": addresses, "chunk": args.chunk, "max_tokens": args.max_tokens,
                   "requests": args.requests, "micro": micro, "profile": profile, "wait": wait}
            pin = (lambda cpu=rank % os.cpu_count(): os.sched_setaffinity(0, {cpu})) if args.pin else None
            procs.append(subprocess.Popen([sys.executable, __file__, "--rank-config", json.dumps(cfg)], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=pin))
        out = []
        deadline = time.monotonic() + args.timeout
        for p in procs:
            stdout, stderr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if p.returncode != 0:
                raise RuntimeError(f"a rank failed: {stderr[-2000:]}")
            out.append(json.loads(stdout.strip().splitlines()[-1]))
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", type=Path)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=64, help="prefill chunk size (tokens)")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--requests", type=int, default=1, help="requests at once (one batch)")
    ap.add_argument("--micro-batches", type=int, nargs="+", default=None,
                    help="EngineSettings.micro_batches, one for every world or one per entry of --ranks (default: its own)")
    ap.add_argument("--waits", nargs="+", choices=("on", "off"), default=["on"],
                    help="ranks wait asleep (on) or spin in MLX's receive (off): one for every world or one per entry of --ranks")
    ap.add_argument("--threads", type=int, default=2, help="BLAS threads per rank")
    ap.add_argument("--profile", action="store_true", help="also a profiled run of each multi-rank world")
    ap.add_argument("--pin", action="store_true",
                    help="rank r runs on core r only (with --threads 1: each rank a machine of one core)")
    ap.add_argument("--rank-config", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_config:
        try:
            print(json.dumps(rank_main(json.loads(args.rank_config))), flush=True)
        except BaseException:
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        os._exit(0)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir
        if model_dir is None:
            from tests.support.models.synthetic_models import make_synthetic_model

            model_dir = make_synthetic_model(Path(tmp) / "synthetic", n_layers=args.layers, hidden_size=args.hidden,
                                             num_attention_heads=8, num_key_value_heads=4,
                                             intermediate_size=4 * args.hidden)
        n_layers = json.loads((Path(model_dir) / "config.json").read_text())["num_hidden_layers"]
        print(f"model {model_dir} ({n_layers} layers), max_tokens {args.max_tokens}, chunk {args.chunk}")
        base = None
        micros = args.micro_batches or [None]
        micros = micros * len(args.ranks) if len(micros) == 1 else micros
        waits = args.waits * len(args.ranks) if len(args.waits) == 1 else args.waits
        for world, micro, wait in zip(args.ranks, micros, waits, strict=True):
            res = run_world(Path(model_dir), n_layers, world, args, micro=micro, wait=wait == "on")
            r0 = res[0]
            key = "aggregate_tps" if args.requests > 1 else "tps"
            if base is None:
                base = r0
            ratio = r0[key] / base[key] if base[key] else 0.0
            peaks = ", ".join(f"r{r['rank']} {r['peak_memory_bytes'] / 2**20:.1f} MiB" for r in res)
            what = f"{args.requests} requests: {r0[key]:.1f} tok/s aggregate" if args.requests > 1 else f"decode {r0[key]:.1f} tok/s"
            cpu = ", ".join(f"r{r['rank']} {r['cpu']:.1f}" for r in res)
            late = sum(r["wait_timeouts"] for r in res)
            print(f"ranks {world}, micro-batches {micro or 'default'}, waits {wait if world > 1 else '-'}: {what} "
                  f"(x{ratio:.2f} of {args.ranks[0]} rank), "
                  f"TTFT {r0['ttft'] * 1000:.0f} ms ({r0['prompt_tokens']} prompt tokens), "
                  f"{r0['completion_tokens']} tokens in {r0['wall']:.1f} s; CPU s {cpu}; waits out of patience {late}; "
                  f"peak load memory: {peaks}", flush=True)
            if world > 1 and args.requests > 1 and args.profile:
                prof = run_world(Path(model_dir), n_layers, world, args, profile=True, micro=micro)
                for r in prof:
                    parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["times"].items()))
                    print(f"  profiled rank {r['rank']}: {r['aggregate_tps']:.1f} tok/s, wall {r['wall']:.2f} s = {parts} s; "
                          f"transfer of [{args.requests}, 1, hidden] one way {r['transfer'] * 1e3:.2f} ms", flush=True)

if __name__ == "__main__":
    main()
