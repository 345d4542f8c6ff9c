"""Continuous batching through the HTTP API: aggregate decode speed by concurrency,
and the TTFT of a request joining a busy batch.

Starts a real ``exo-p2p node`` (``--max-batch``, default 16) with the embedded model, or a
2-node pipeline instance with ``--nodes 2``, and measures, with streaming chat completions
(greedy, each stream its own prompt):

- aggregate decode tokens/s for 1, 4, 8, 16 concurrent streams, and its ratio to 1 stream,
  two ways: *steady*, the tokens all streams received while every one of them was decoding
  (from the last stream's first token to the first stream's last token) ÷ that window: the
  batch's decode rate; and *round*, all completion tokens of the round ÷ (last token − first
  token of the round), which also counts the time the batch spent prefilling the prompts
  that join after the first (they are prefilled one by one between decode steps);
  per-stream decode (``completion_tokens / (t_last − t_first)`` of each stream, median) and
  its ratio to a lone stream;
- TTFT of one request sent while 8 others decode ÷ its TTFT alone (idle instance);
- with ``--prompt-cache-bytes`` > 0: second-turn TTFT of a conversation whose
  first turn ran (its KV cached) vs a second turn of the same length whose first turn never
  ran here (nothing cached: the whole prompt is prefilled).

Targets (float32 + BLAS engine): 8 streams ≥ 4× one, 16 ≥ 6×, per-stream decode
at 8 ≥ 0.5× a lone stream, joining TTFT ≤ 2× alone.

    .venv/bin/python scripts/bench_batch.py [--max-tokens 48] [--nodes 1|2] [--max-batch 16]
        [--prompt-cache-bytes 268435456] [--no-observe]

``--no-observe`` runs the nodes without metrics and request records; ``scripts/bench_observe.py``
alternates rounds with and without them in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.support.cluster import NodeProcess, converged, nodes_cleanup, wait_until  # noqa: E402

MODEL = "smollm2-135m-instruct"
TOPICS = ["a robot who learns to paint", "the sea at night", "a city of glass", "an old clock",
          "a fox and a crow", "the first snow", "a lighthouse keeper", "a lost key", "a desert train",
          "a garden on the moon", "a library of echoes", "a baker's dawn", "a paper boat", "a quiet war",
          "a mountain choir", "the last bus", "a cat detective"]


class Stream:
    """One streaming chat completion, timed by this process's clock (seconds)."""

    def __init__(self, url: str, topic: str, max_tokens: int, messages: list | None = None) -> None:
        self.url, self.topic, self.max_tokens = url, topic, max_tokens
        self.messages = messages or [{"role": "user", "content": f"Write a short story about {topic}."}]
        self.text = ""
        self.times: list[float] = []  # when each content chunk (one token) arrived
        self.t0 = self.t_first = self.t_last = 0.0
        self.completion = 0
        self.error: str | None = None

    def run(self) -> None:
        body = {"model": MODEL, "messages": self.messages,
                "temperature": 0, "max_tokens": self.max_tokens, "stream": True,
                "stream_options": {"include_usage": True}}
        self.t0 = time.perf_counter()
        try:
            with httpx.stream("POST", self.url + "/v1/chat/completions", json=body, timeout=600) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        raise RuntimeError(str(chunk["error"]))
                    if chunk.get("usage"):
                        self.completion = chunk["usage"]["completion_tokens"]
                    if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                        self.text += chunk["choices"][0]["delta"]["content"]
                        now = time.perf_counter()
                        self.times.append(now)
                        self.t_first = self.t_first or now
                        self.t_last = now
        except Exception as e:  # reported in the table
            self.error = f"{type(e).__name__}: {e}"

    @property
    def ttft(self) -> float:
        return self.t_first - self.t0

    @property
    def decode(self) -> float:
        return (self.completion - 1) / (self.t_last - self.t_first) if self.t_last > self.t_first else 0.0


def concurrent(url: str, n: int, max_tokens: int, offset: int = 0) -> list[Stream]:
    streams = [Stream(url, TOPICS[(offset + i) % len(TOPICS)], max_tokens) for i in range(n)]
    threads = [threading.Thread(target=s.run) for s in streams]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    errors = [s.error for s in streams if s.error]
    if errors:
        raise RuntimeError(f"{len(errors)} of {n} streams failed: {errors[0]}")
    return streams


def cpu_seconds(nodes: list[NodeProcess]) -> dict[str, float]:
    """CPU seconds (user + system) used so far by the node processes (API, routing, cluster),
    their runner processes (the model), and this benchmark's own process (the clients)."""
    import psutil

    out = {"node": 0.0, "runner": 0.0, "client": 0.0}
    for node in nodes:
        if node.proc is None:
            continue
        p = psutil.Process(node.proc.pid)
        t = p.cpu_times()
        out["node"] += t.user + t.system
        for kid in p.children(recursive=True):
            try:
                k = kid.cpu_times()
                out["runner"] += k.user + k.system
            except psutil.Error:
                pass
    me = psutil.Process().cpu_times()
    out["client"] = me.user + me.system
    return out


def aggregate(streams: list[Stream]) -> float:
    """Round rate: all completion tokens ÷ (last token − first token of the round), tokens/s."""
    span = max(s.t_last for s in streams) - min(s.t_first for s in streams)
    return sum(s.completion for s in streams) / span if span > 0 else 0.0


def steady(streams: list[Stream]) -> float | None:
    """Steady decode rate: tokens received by all streams while every stream was decoding
    (between the last stream's first token and the first stream's last token) ÷ that window,
    tokens/s; None when the streams never all decoded at once (raise ``--max-tokens``)."""
    start, end = max(s.t_first for s in streams), min(s.t_last for s in streams)
    if end - start < 0.5:
        return None
    # each stream's tokens after `start` up to `end`: intervals, so a stream's first token at
    # `start` is not counted (it ends the interval before the window)
    tokens = sum(sum(1 for t in s.times if start < t <= end) for s in streams)
    return tokens / (end - start)


def joining_ttft(url: str, max_tokens: int) -> tuple[float, float]:
    """(TTFT alone, TTFT while 8 streams decode), seconds."""
    alone = Stream(url, TOPICS[16], 4)
    alone.run()
    busy = [Stream(url, TOPICS[i], max_tokens * 4) for i in range(8)]
    threads = [threading.Thread(target=s.run) for s in busy]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not all(s.t_first for s in busy):
        time.sleep(0.05)
    joiner = Stream(url, TOPICS[16], 4)
    joiner.run()
    for t in threads:
        t.join(timeout=900)
    for s in (alone, joiner, *busy):
        if s.error:
            raise RuntimeError(s.error)
    return alone.ttft, joiner.ttft


def second_turn_ttft(url: str) -> tuple[float, float]:
    """(second-turn TTFT with the first turn cached, a same-size second turn with nothing
    cached), seconds."""
    def long_first(topic: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"Here are my notes on {topic}: " + f"{topic} is worth a story. " * 40
                 + "Write a short story from them."}]

    def run(messages: list, max_tokens: int) -> Stream:
        s = Stream(url, "", max_tokens, messages)
        s.run()
        if s.error:
            raise RuntimeError(s.error)
        return s

    first = long_first("a paper boat")
    reply = run(first, 24).text
    cached = run([*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "Make it sadder."}], 4)
    other = long_first("a glass boat")  # same length, never run: nothing to reuse
    cold = run([*other, {"role": "assistant", "content": reply}, {"role": "user", "content": "Make it sadder."}], 4)
    return cached.ttft, cold.ttft


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--nodes", type=int, default=1, choices=[1, 2])
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--prompt-cache-bytes", type=int, default=0)
    ap.add_argument("--only-prompt-cache", action="store_true", help="skip the concurrency and joining parts")
    ap.add_argument("--no-observe", action="store_true",
                    help="nodes without metrics and request records (--no-metrics --no-request-records)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        extra = ["--max-batch", str(args.max_batch), "--prompt-cache-bytes", str(args.prompt_cache_bytes)]
        extra += ["--no-metrics", "--no-request-records"] if args.no_observe else []
        a = NodeProcess(Path(tmp) / "a", extra_args=extra)
        nodes = [a]
        with nodes_cleanup(nodes):
            a.start()
            if args.nodes == 2:
                boot = [x for addr in a.addrs() for x in ("--bootstrap", addr)]
                b = NodeProcess(Path(tmp) / "b", cluster=a.cluster, extra_args=[*extra, *boot])
                nodes.append(b)
                b.start()
                wait_until(lambda: converged(nodes, 2), 60, what="2-node cluster")
            a.place_and_wait(MODEL, timeout=900, **({"min_nodes": 2} if args.nodes == 2 else {}))
            concurrent(a.url, 1, 4)  # warm up
            turns = second_turn_ttft(a.url) if args.prompt_cache_bytes > 0 else None
            if turns is not None:
                print(f"second turn TTFT: first turn cached {turns[0]:.3f} s, nothing cached {turns[1]:.3f} s, "
                      f"ratio {turns[0] / turns[1]:.2f}", flush=True)
            if args.only_prompt_cache:
                return 0
            rows = []
            for n in args.streams:
                cpu0, t0 = cpu_seconds(nodes), time.perf_counter()
                streams = concurrent(a.url, n, args.max_tokens, offset=n)
                cpu1, wall = cpu_seconds(nodes), time.perf_counter() - t0
                rows.append((n, aggregate(streams), statistics.median(s.decode for s in streams),
                             statistics.median(s.ttft for s in streams), steady(streams)))
                used = {k: cpu1[k] - cpu0[k] for k in cpu0}
                print(f"{n:>2} streams: steady {_rate(rows[-1][4])} tok/s, round {rows[-1][1]:.1f} tok/s, "
                      f"per-stream {rows[-1][2]:.1f} tok/s, "
                      f"median TTFT {rows[-1][3]:.3f} s; CPU s over {wall:.1f} s: "
                      + ", ".join(f"{k} {v:.1f}" for k, v in used.items()), flush=True)
            alone, joined = joining_ttft(a.url, args.max_tokens)
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (1 min), {os.getloadavg()[1]:.1f} (5 min)")
    base, lone, steady_base = rows[0][1], rows[0][2], rows[0][4]
    print(f"\n{MODEL}, {args.nodes} node(s), --max-batch {args.max_batch}, max_tokens {args.max_tokens}")
    print("streams  steady tok/s  ratio to 1  round tok/s  ratio to 1  per-stream tok/s  ratio to lone")
    for n, agg, per, _, st in rows:
        ratio = f"{st / steady_base:.2f}" if st is not None and steady_base else "-"
        print(f"{n:>7}  {_rate(st):>12}  {ratio:>10}  {agg:>11.1f}  {agg / base:>10.2f}  {per:>16.1f}  {per / lone:>13.2f}")
    print(f"TTFT alone {alone:.3f} s, joining 8 decoding streams {joined:.3f} s: ratio {joined / alone:.2f} (target <= 2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
