"""Pipeline benchmark: decode tokens/s and TTFT for 1, 2 and 3 ranks on this machine, in one
run, with the ratio to 1 rank and each rank's peak memory during load.

    python scripts/bench_pipeline.py [--model-dir DIR] [--ranks 1 2 3] [--max-tokens 64]

Without ``--model-dir`` a synthetic llama model (random weights; ``--layers``/``--hidden``)
is written to a temp dir. Ranks are processes on 127.0.0.1 joined by MLX's ring backend
(worker/engine/distributed.py); each runs the engine (``build_engine``) with a PipelineStage. Greedy
decoding; the same prompt for every world size; the first request of each run is a warm-up
and is not measured. Every process is killed at the end.
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


def rank_main(cfg: dict) -> dict:
    """One rank: join the ring, load its layers, run a warm-up then the measured request."""
    from exo_p2p.types.chunks import FinishChunk
    from exo_p2p.types.engine import EngineSettings
    from exo_p2p.types.tasks import ChatMessage, GenerationParams
    from worker.engine.builder import build_engine
    from worker.engine.distributed import init_ring
    from worker.engine.loader import load_all
    from worker.engine.pipeline import PipelineStage, probe_hidden_dtype

    group = None
    if cfg["world_size"] > 1:
        group = init_ring(cfg["addresses"], cfg["rank"], cfg["world_size"])
    loaded = load_all(cfg["model_dir"], start_layer=cfg["start"], end_layer=cfg["end"])
    stage = None
    if group is not None:
        c = loaded.config.get("text_config", loaded.config)
        stage = PipelineStage(group, int(c["hidden_size"]), probe_hidden_dtype(loaded.model, group, int(c["hidden_size"])))
    gen = build_engine(loaded, EngineSettings(prefill_chunk_size=cfg["chunk"]), stage=stage)
    results = {}
    for task_id, max_tokens in (("warmup", 4), ("measured", cfg["max_tokens"])):
        gen.submit(task_id, GenerationParams(messages=(ChatMessage("user", PROMPT),), max_tokens=max_tokens,
                                             temperature=0.0))
        for _ in range(100_000):
            if not gen.has_work():
                break
            for chunk in gen.step():
                if isinstance(chunk, FinishChunk):
                    results[task_id] = chunk
    f = results["measured"]
    return {"rank": cfg["rank"], "ttft": f.ttft, "tps": f.decode_tokens_per_second,
            "completion_tokens": f.completion_tokens, "prompt_tokens": f.prompt_tokens,
            "peak_memory_bytes": loaded.peak_memory_bytes}


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


def run_world(model_dir: Path, n_layers: int, world: int, args: argparse.Namespace) -> list[dict]:
    addresses = [f"127.0.0.1:{p}" for p in free_ports(world)]
    procs = []
    try:
        for rank, (start, end) in enumerate(split(n_layers, world)):
            cfg = {"model_dir": str(model_dir), "rank": rank, "world_size": world, "start": start, "end": end,
                   "addresses": addresses, "chunk": args.chunk, "max_tokens": args.max_tokens}
            procs.append(subprocess.Popen([sys.executable, __file__, "--rank-config", json.dumps(cfg)],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
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
            from exo_p2p.models.synthetic import make_synthetic_model

            model_dir = make_synthetic_model(Path(tmp) / "synthetic", n_layers=args.layers, hidden_size=args.hidden,
                                             num_attention_heads=8, num_key_value_heads=4,
                                             intermediate_size=4 * args.hidden)
        n_layers = json.loads((Path(model_dir) / "config.json").read_text())["num_hidden_layers"]
        print(f"model {model_dir} ({n_layers} layers), max_tokens {args.max_tokens}, chunk {args.chunk}")
        base = None
        for world in args.ranks:
            res = run_world(Path(model_dir), n_layers, world, args)
            r0 = res[0]
            if base is None:
                base = r0
            ratio = r0["tps"] / base["tps"] if base["tps"] else 0.0
            peaks = ", ".join(f"r{r['rank']} {r['peak_memory_bytes'] / 2**20:.1f} MiB" for r in res)
            print(f"ranks {world}: decode {r0['tps']:.1f} tok/s (x{ratio:.2f} of {args.ranks[0]} rank), "
                  f"TTFT {r0['ttft'] * 1000:.0f} ms ({r0['prompt_tokens']} prompt tokens), "
                  f"{r0['completion_tokens']} tokens; peak load memory: {peaks}")


if __name__ == "__main__":
    main()
