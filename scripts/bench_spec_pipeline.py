"""Speculative decoding on a 2-node pipeline: single-stream decode tokens/s of the edit
workload (``bench_spec.WORKLOADS``) on two runner processes joined by the ring on 127.0.0.1
(the embedded SmolLM2's layers split in two, float32, the optimised BLAS preloaded), with
speculation off and ``ngram`` alternating run by run; the load average printed with the
figures. Decode tokens/s counts the tokens after the first over the time after the first,
as chunks reach this process (polled every 5 ms).

    .venv/bin/python scripts/bench_spec_pipeline.py [--runs 1] [--max-tokens 128] [--workload edit]
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pipeline_runners(model_dir: Path, n_layers: int, speculative: str, num_draft: int) -> list:
    """Two pipeline runner ranks of ``model_dir`` (float32) on instance ``i1``, connecting."""
    from tests.support.runners import RunnerProc, free_ports, layer_split
    from exo_p2p.types.engine import EngineSettings
    from exo_p2p.types.instances import Instance, ShardMetadata
    from exo_p2p.types.tasks import ConnectToGroup
    from worker.runner.protocol import RunnerSetup

    ports = free_ports(2)
    shards = tuple(ShardMetadata(node_id=f"n{r}", runner_id=f"r{r}", rank=r, world_size=2, start_layer=a, end_layer=b,
                                 n_layers=n_layers, share_bytes=0, boot_id="b", ring_address=f"127.0.0.1:{ports[r]}",
                                 weights_dtype="float32")
                   for r, (a, b) in enumerate(layer_split(n_layers, 2)))
    instance = Instance(instance_id="i1", model_id="synthetic", sharding="pipeline", shards=shards)
    settings = EngineSettings(prefill_chunk_size=256, max_batch=1, prompt_cache_bytes=0, speculative=speculative,
                              num_draft=num_draft)
    runners = [RunnerProc(RunnerSetup(instance=instance, shard=s, model_dir=str(model_dir), heartbeat_interval=0.5,
                                      engine=settings)) for s in shards]
    for r in runners:
        r.send(ConnectToGroup(runner_id="x"))
    return runners


def one_run(model_dir: Path, n_layers: int, spec: str, params, num_draft: int) -> tuple[float, int]:  # noqa: ANN001
    """Decode tokens/s and completion tokens of one request on a fresh 2-rank pipeline."""
    from tests.support.runners import bring_up, deliver, shut_down_cleanly, task_for_request
    from exo_p2p.types.chunks import FinishChunk, TokenChunk

    runners = pipeline_runners(model_dir, n_layers, spec, num_draft)
    try:
        bring_up(runners)
        task = task_for_request(0, ("bench", params))
        deliver(runners, [task])
        first, count, deadline = None, 0, time.monotonic() + 1800
        while time.monotonic() < deadline:
            chunks = runners[0].chunks("bench")
            if first is None and any(isinstance(c, TokenChunk) for c in chunks):
                first = time.perf_counter()
            done = [c for c in chunks if isinstance(c, FinishChunk)]
            if done:
                end, count = time.perf_counter(), done[0].completion_tokens
                break
            time.sleep(0.005)
        else:
            raise RuntimeError("the request did not finish in 30 minutes")
        shut_down_cleanly(runners)
    finally:
        for r in runners:
            r.close()
    assert first is not None
    return (count - 1) / max(end - first, 1e-9), count


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--num-draft", type=int, default=8)
    ap.add_argument("--workload", default="edit")
    args = ap.parse_args()
    from worker import blas

    if "EXO_P2P_BENCH_CHILD" not in os.environ:  # re-run with the BLAS preloaded (the runners inherit it)
        env = blas.runner_environment(dict(os.environ), blas.find_optimised_blas(), 1)
        env["EXO_P2P_BENCH_CHILD"] = "1"
        sys.exit(subprocess.call([sys.executable, *sys.argv], env=env))
    from bench_spec import WORKLOADS

    from exo_p2p.models.gguf.importer import import_gguf
    from exo_p2p.models.stores.embedded import find_embedded_gguf
    from exo_p2p.types.tasks import ChatMessage, GenerationParams

    params = GenerationParams(messages=(ChatMessage("user", WORKLOADS[args.workload]),), max_tokens=args.max_tokens,
                              temperature=0.0)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = import_gguf(find_embedded_gguf(), Path(tmp) / "smollm2")
        n_layers = json.loads((Path(model_dir) / "config.json").read_text())["num_hidden_layers"]
        rates: dict[str, list[float]] = {"off": [], "ngram": []}
        counts = set()
        load = os.getloadavg()[0]
        for _ in range(args.runs):
            for spec in ("off", "ngram"):
                rate, count = one_run(Path(model_dir), n_layers, spec, params, args.num_draft)
                rates[spec].append(rate)
                counts.add(count)
        off, on = statistics.median(rates["off"]), statistics.median(rates["ngram"])
        print(f"load average {load:.1f} → {os.getloadavg()[0]:.1f}; 2-rank pipeline, decode tok/s, median of {args.runs}")
        print(f"| {args.workload}, 2-rank pipeline | {sorted(counts)} | {off:.1f} | {on:.1f} | **{on / off:.2f}×** |")


if __name__ == "__main__":
    main()
