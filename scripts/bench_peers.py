"""Our node beside mlx-lm's own server (and llama.cpp's, when installed), the same client load.

One machine, one run, the servers up side by side and the rounds alternating between them,
so load from other work drifts over all of them alike:

- **exo-p2p**: a real ``exo-p2p node`` (``--max-batch``, default 16) serving the float32
  weights below from ``--models-dir``, its runners with the same OpenBLAS and threads;
- **mlx_lm.server** on the same directory (``--decode-concurrency`` = ``--max-batch``,
  ``--prompt-concurrency 8``), started with the environment a runner gets
  (``worker.blas.runner_environment``: OpenBLAS preloaded, ``--threads`` threads). No
  ``seed`` is sent (mlx-lm serves a request with a seed alone, not batched);
- **llama-server** (``-np`` = ``--max-batch``, ``-t`` = ``--threads``) on the embedded GGUF,
  when ``llama-server`` is on the PATH or given with ``--llama-server`` (building llama.cpp
  takes tens of minutes on 2 cores: optional, like the ``.[bench]`` extra).

The weights: the embedded SmolLM2-135M GGUF imported to MLX and converted once with
``mlx_lm.convert --dequantize --dtype float32`` into ``--work-dir`` (kept for later runs).

The load: for each concurrency (``--concurrency``, default 1 4 8 16 32) and each mode
(streamed, not streamed), N greedy chat requests at once, each its own prompt, ``--max-tokens``
completion tokens at most. Per server and cell: aggregate completion tokens ÷ the round's
wall time (first request sent → last response done), TTFT p50/p95 (streamed: request sent →
first content chunk; not streamed: the whole response's latency) and the CPU seconds of the
server's process tree. ``--rounds`` repeats every cell (medians printed); the order of the
servers alternates from cell to cell.

    .venv/bin/python scripts/bench_peers.py [--rounds 1] [--max-tokens 64] [--concurrency 1 4 8 16 32]
        [--max-batch 16] [--threads 2] [--modes stream plain] [--only exo-p2p mlx_lm.server]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.support.cluster import NodeProcess, free_port  # noqa: E402

MODEL_NAME = "smollm2-135m-f32"
TOPICS = ["a robot who learns to paint", "the sea at night", "a city of glass", "an old clock",
          "a fox and a crow", "the first snow", "a lighthouse keeper", "a lost key", "a desert train",
          "a garden on the moon", "a library of echoes", "a baker's dawn", "a paper boat", "a quiet war",
          "a mountain choir", "the last bus", "a cat detective"]
STYLES = ["short story", "poem", "fable", "letter"]


def prompt(i: int) -> str:
    """Request ``i``'s prompt (64 distinct ones, about the same length)."""
    return f"Write a {STYLES[(i // len(TOPICS)) % len(STYLES)]} about {TOPICS[i % len(TOPICS)]}."


def float32_weights(work: Path) -> Path:
    """The embedded model as float32 MLX weights in ``work`` (made once, then reused)."""
    out = work / MODEL_NAME
    if (out / "config.json").is_file():
        return out
    from exo_p2p.models.stores.embedded import find_embedded_gguf
    from exo_p2p.models.gguf.importer import import_gguf

    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        stored = import_gguf(find_embedded_gguf(), Path(tmp) / "stored")
        subprocess.run([sys.executable, "-m", "mlx_lm", "convert", "--hf-path", str(stored), "--mlx-path",
                        str(Path(tmp) / "f32"), "--dequantize", "--dtype", "float32"], check=True,
                       stdout=subprocess.DEVNULL)
        (Path(tmp) / "f32").rename(out)
    return out


def _tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and its children so far."""
    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


class Server:
    """One server under test: ``url``, the ``model`` field its requests carry, ``pid``."""

    name = ""
    url = ""
    model = ""
    pid = 0

    def cpu(self) -> float:
        return _tree_cpu(self.pid)

    def stop(self) -> None:
        raise NotImplementedError


class Ours(Server):
    name = "exo-p2p"

    def __init__(self, tmp: Path, weights: Path, max_batch: int, threads: int) -> None:
        self.node = NodeProcess(tmp / "node", env={"OPENBLAS_NUM_THREADS": str(threads)},
                                extra_args=["--models-dir", str(weights.parent), "--max-batch", str(max_batch),
                                            "--cpu-weights", "stored"])
        self.node.start()
        self.node.place_and_wait(weights.name, timeout=600)
        self.url, self.model, self.pid = self.node.url, weights.name, self.node.proc.pid

    def stop(self) -> None:
        self.node.stop()


class Spawned(Server):
    """A server started as one process here, ready once ``GET ready_path`` answers 200."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path, ready_path: str, timeout: float = 600) -> None:
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        self.pid = self.proc.pid
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: see {log}")
            try:
                if httpx.get(self.url + ready_path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"{self.name} did not answer within {timeout} s: see {log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class MlxLm(Spawned):
    name = "mlx_lm.server"

    def __init__(self, tmp: Path, weights: Path, max_batch: int, env: dict[str, str]) -> None:
        port = free_port()
        self.url, self.model = f"http://127.0.0.1:{port}", str(weights)
        super().__init__([sys.executable, "-m", "mlx_lm", "server", "--model", str(weights), "--port", str(port),
                          "--decode-concurrency", str(max_batch), "--prompt-concurrency", "8",
                          "--log-level", "WARNING"], env, tmp / "mlx_lm.log", "/health")


class LlamaServer(Spawned):
    name = "llama-server"

    def __init__(self, tmp: Path, binary: str, max_batch: int, threads: int, env: dict[str, str]) -> None:
        from exo_p2p.models.stores.embedded import find_embedded_gguf

        port = free_port()
        self.url, self.model = f"http://127.0.0.1:{port}", "smollm2"
        super().__init__([binary, "-m", str(find_embedded_gguf()), "--port", str(port), "-np", str(max_batch),
                          "-t", str(threads), "-c", str(1024 * max_batch)], env, tmp / "llama.log", "/health")


class Request:
    """One chat completion, timed by this process's clock (seconds)."""

    def __init__(self, server: Server, i: int, max_tokens: int, stream: bool) -> None:
        self.body = {"model": server.model, "messages": [{"role": "user", "content": prompt(i)}],
                     "temperature": 0, "max_tokens": max_tokens, "stream": stream}
        if stream:
            self.body["stream_options"] = {"include_usage": True}
        self.url = server.url + "/v1/chat/completions"
        self.t0 = self.t_first = self.t_end = 0.0
        self.completion = 0
        self.error: str | None = None

    def run(self) -> None:
        self.t0 = time.perf_counter()
        try:
            if self.body["stream"]:
                self._streamed()
            else:
                r = httpx.post(self.url, json=self.body, timeout=900)
                r.raise_for_status()
                self.completion = r.json()["usage"]["completion_tokens"]
                self.t_first = time.perf_counter()
        except Exception as e:  # noqa: BLE001 - reported by the round
            self.error = f"{type(e).__name__}: {e}"
        self.t_end = time.perf_counter()

    def _streamed(self) -> None:
        chunks = 0
        with httpx.stream("POST", self.url, json=self.body, timeout=900) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    self.completion = chunk["usage"]["completion_tokens"]
                if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                    chunks += 1
                    self.t_first = self.t_first or time.perf_counter()
        self.completion = self.completion or chunks


def one_round(server: Server, n: int, max_tokens: int, stream: bool, offset: int) -> dict:
    """``n`` requests at once: aggregate tok/s, TTFT p50/p95 (s), CPU seconds of the server."""
    reqs = [Request(server, offset + i, max_tokens, stream) for i in range(n)]
    threads = [threading.Thread(target=r.run) for r in reqs]
    cpu0 = server.cpu()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    cpu = server.cpu() - cpu0
    errors = [r.error for r in reqs if r.error]
    if errors:
        raise RuntimeError(f"{server.name}: {len(errors)} of {n} requests failed: {errors[0]}")
    wall = max(r.t_end for r in reqs) - min(r.t0 for r in reqs)
    ttfts = sorted(r.t_first - r.t0 for r in reqs)
    return {"tps": sum(r.completion for r in reqs) / wall, "ttft50": statistics.median(ttfts),
            "ttft95": ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))], "cpu": cpu, "wall": wall,
            "tokens": sum(r.completion for r in reqs)}


def _median(cells: list[dict], key: str) -> float:
    return statistics.median(c[key] for c in cells)


def report(servers: list[Server], results: dict, args: argparse.Namespace) -> None:
    names = [s.name for s in servers]
    print(f"\n{MODEL_NAME} (float32), max_tokens {args.max_tokens}, batch {args.max_batch}, BLAS threads "
          f"{args.threads}, {args.rounds} round(s), medians; load average now {os.getloadavg()[0]:.1f}")
    head = "mode    N  " + "  ".join(f"{n[:13]:>13} tok/s" for n in names)
    head += "  " + "  ".join(f"exo/{n[:9]:<9}" for n in names[1:]) + "  TTFT p50/p95 s: " + " | ".join(names)
    print(head)
    for mode in args.modes:
        for n in args.concurrency:
            cells = [results[(s.name, mode, n)] for s in servers]
            tps = [_median(c, "tps") for c in cells]
            line = f"{mode:<6} {n:>2}  " + "  ".join(f"{t:>19.1f}" for t in tps)
            line += "  " + "  ".join(f"{tps[0] / t:>13.2f}" for t in tps[1:])
            line += "  " + " | ".join(f"{_median(c, 'ttft50'):.2f}/{_median(c, 'ttft95'):.2f}" for c in cells)
            line += "   CPU s/round: " + ", ".join(f"{_median(c, 'cpu'):.1f}" for c in cells)
            print(line)


def main() -> int:
    from worker import blas

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    ap.add_argument("--modes", nargs="+", choices=("stream", "plain"), default=["stream", "plain"])
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=blas.offered_cores(), help="BLAS threads (default: the cores)")
    ap.add_argument("--work-dir", type=Path, default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                    / "exo-p2p" / "bench-peers", help="where the float32 weights are kept")
    ap.add_argument("--llama-server", default=shutil.which("llama-server"), help="llama-server binary (optional)")
    ap.add_argument("--only", nargs="+", help="servers to run (exo-p2p, mlx_lm.server, llama-server)")
    args = ap.parse_args()

    weights = float32_weights(args.work_dir)
    plain = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "OPENBLAS_NUM_THREADS")}
    env = {**blas.runner_environment(plain, blas.find_optimised_blas(), args.threads), "HF_HUB_OFFLINE": "1"}
    wanted = set(args.only or ("exo-p2p", "mlx_lm.server", "llama-server"))
    servers: list[Server] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        try:
            if "exo-p2p" in wanted:
                servers.append(Ours(tmp, weights, args.max_batch, args.threads))
            if "mlx_lm.server" in wanted:
                servers.append(MlxLm(tmp, weights, args.max_batch, env))
            if "llama-server" in wanted and args.llama_server:
                servers.append(LlamaServer(tmp, args.llama_server, args.max_batch, args.threads, plain))
            elif "llama-server" in wanted:
                print("llama-server: not installed (optional; see the docstring)")
            for s in servers:  # warm-up, not counted
                one_round(s, 2, 8, True, 60)
            print(f"servers up: {', '.join(s.name for s in servers)}; load average {os.getloadavg()[0]:.1f}", flush=True)
            results: dict = {(s.name, m, n): [] for s in servers for m in args.modes for n in args.concurrency}
            cell = 0
            for r in range(args.rounds):
                for mode in args.modes:
                    for n in args.concurrency:
                        order = servers if cell % 2 == 0 else servers[::-1]
                        cell += 1
                        for s in order:
                            out = one_round(s, n, args.max_tokens, mode == "stream", offset=n + r)
                            results[(s.name, mode, n)].append(out)
                            print(f"round {r} {mode:<6} {n:>2} {s.name:<14} {out['tps']:6.1f} tok/s "
                                  f"({out['tokens']} tokens, {out['wall']:.1f} s), TTFT p50 {out['ttft50']:.2f} s "
                                  f"p95 {out['ttft95']:.2f} s, CPU {out['cpu']:.1f} s, "
                                  f"load {os.getloadavg()[0]:.1f}", flush=True)
        finally:
            for s in servers:
                s.stop()
    report(servers, results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
