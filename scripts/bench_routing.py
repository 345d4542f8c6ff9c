"""Prefix-aware routing against least-loaded routing, on two replicas on two real nodes.

Starts two ``exo-p2p node`` processes with the embedded model and a prompt cache, places one
instance on each, and replays the same workload twice — once with ``--routing prefix``, once
with ``--routing load`` (a fresh pair of nodes each time): five 6-turn conversations at once
(one replayed conversation with short answers and four independent ones with longer
answers and pauses of their own between turns, interleaved: each its own thread, started
1.5 s apart), every conversation opening with a long message of its own (~400 tokens of
notes) and going on with short turns that repeat the history. Every request goes through
node a's API; its request records (``GET /requests``) say which instance served each turn
and why.

Reports per mode, for the replayed conversation and for all five: the mean TTFT of turns
2–6, how many of those turns landed on the instance that served the conversation's first
turn (the one holding its prefix), and the ratio of the means prefix ÷ load (target ≤ 0.5);
every turn's instance, route, prompt and cached tokens and TTFT with its parts (the
records' ``routed``, ``runner_ttft``, ``runner_queued``), and the means of the parts.

The replayed conversation starts 4 s in by default (``--replayed-at``), interleaved with
the independent conversations (they start 1.5 s apart from 1.5 s): its first turn lands by
load, and least-loaded routing moves a later turn whenever the other instance is less
loaded — the situation prefix routing is for. ``--replayed-at 0`` starts it first, on an
idle cluster, where least-loaded routing breaks load ties by instance id: it lands on the
instance that wins every tie and stays there under either routing, so the two routings
serve it alike (measured: 1.04).

    .venv/bin/python scripts/bench_routing.py [--turns 6] [--conversations 5] [--max-tokens 16]
        [--other-max-tokens 48] [--replayed-at 4] [--modes prefix load]
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
TOPICS = ["a paper boat", "the lighthouse", "a glass city", "an old clock", "the desert train", "a moon garden"]
FOLLOW_UPS = ["Make it shorter.", "Now make it sadder.", "Give it a title.", "Add a dog.", "End it happily."]


def notes(topic: str) -> str:
    return (f"Here are my notes on {topic}. " + " ".join(f"Note {i}: {topic} matters for reason {i}." for i in range(40))
            + " Write a short story from them.")


def turn(url: str, messages: list[dict], max_tokens: int) -> tuple[str, str, float]:
    """(request id, text, TTFT in seconds) of one streamed chat completion."""
    body = {"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": max_tokens, "stream": True}
    t0 = time.perf_counter()
    first, text, rid = None, [], ""
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            rid = chunk.get("id", rid)
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {}).get("content")
                if delta:
                    first = first or time.perf_counter()
                    text.append(delta)
    return rid.removeprefix("chatcmpl-"), "".join(text), (first or time.perf_counter()) - t0


def conversation(url: str, topic: str, turns: int, max_tokens: int, out: list, delay: float, pause: float = 0.0) -> None:
    time.sleep(delay)
    messages = [{"role": "user", "content": notes(topic)}]
    for t in range(turns):
        rid, text, ttft = turn(url, messages, max_tokens)
        out.append((topic, t + 1, rid, ttft))
        time.sleep(pause)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": FOLLOW_UPS[t % len(FOLLOW_UPS)]}]


def run_mode(routing: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        extra = ["--prompt-cache-bytes", str(256 * 2**20), "--routing", routing, "--max-batch", "8"]
        a = NodeProcess(Path(tmp) / "a", extra_args=extra)
        nodes = [a]
        with nodes_cleanup(nodes):
            a.start()
            boot = [x for addr in a.addrs() for x in ("--bootstrap", addr)]
            b = NodeProcess(Path(tmp) / "b", cluster=a.cluster, extra_args=[*extra, *boot])
            nodes.append(b)
            b.start()
            wait_until(lambda: converged(nodes, 2), 60, what="2-node cluster")
            for n in nodes:
                a.place_and_wait(MODEL, timeout=900, nodes=[n.get("/health").json()["node_id"]])
            turn(a.url, [{"role": "user", "content": "Hi"}], 2)
            turn(a.url, [{"role": "user", "content": "Hello"}], 2)
            results: list = []
            threads = [threading.Thread(target=conversation, args=(
                a.url, TOPICS[i], args.turns, args.max_tokens if i == 0 else args.other_max_tokens, results,
                args.replayed_at if i == 0 else 1.5 * i, 0.3 * i))
                for i in range(args.conversations)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(900)
            records = {r["request_id"]: r for r in a.get("/requests").json()["records"]}
    return summarise(routing, results, records)


def composition(recs: list[dict]) -> str:
    """The mean TTFT of ``recs`` (request records) split into its parts (``RequestRecord``)."""
    def mean(key) -> float:  # noqa: ANN001
        return statistics.mean(key(r) or 0.0 for r in recs)
    ttft, routed = mean(lambda r: r["ttft"]), mean(lambda r: r["routed"])
    runner, queued = mean(lambda r: r["runner_ttft"]), mean(lambda r: r["runner_queued"])
    return (f"TTFT {ttft:.3f} s = routed {routed:.3f} + runner queue {queued:.3f} + prefill {runner - queued:.3f} "
            f"+ dispatch/delivery {ttft - routed - runner:.3f}; prompt {mean(lambda r: r['prompt_tokens']):.0f} tokens, "
            f"cached {mean(lambda r: r['cached_tokens']):.0f}")


def summarise(routing: str, results: list, records: dict) -> dict:
    for topic, t, rid, ttft in sorted(results, key=lambda x: (TOPICS.index(x[0]), x[1])):
        r = records[rid]
        print(f"  {routing} {topic[:12]:>12} turn {t}: {r['instance'][:8]} {r.get('route') or '-':>12} "
              f"prompt {r['prompt_tokens']:>4} cached {r['cached_tokens']:>4} TTFT {ttft:.3f} (routed {r['routed'] or 0:.3f}, "
              f"runner {r['runner_ttft'] or 0:.3f} of which queued {r['runner_queued'] or 0:.3f})", flush=True)
    first_instance = {topic: records[rid]["instance"] for topic, t, rid, _ in results if t == 1}
    replayed = [(rid, ttft) for topic, t, rid, ttft in results if t > 1 and topic == TOPICS[0]]
    replayed_mean = statistics.mean(ttft for _, ttft in replayed)
    replayed_landed = sum(1 for rid, _ in replayed if records[rid]["instance"] == first_instance[TOPICS[0]])
    print(f"--routing {routing}: the replayed conversation's turns 2+: mean TTFT {replayed_mean:.3f} s, "
          f"landed on its first turn's instance {replayed_landed}/{len(replayed)}", flush=True)
    print(f"--routing {routing}: the replayed conversation's turns 2+: {composition([records[rid] for rid, _ in replayed])}")
    later = [(topic, rid, ttft) for topic, t, rid, ttft in results if t > 1]
    landed = sum(1 for topic, rid, _ in later if records[rid]["instance"] == first_instance[topic])
    routes: dict[str, int] = {}
    for _, rid, _ in later:
        reason = (records[rid].get("route") or "-").split(":")[0]
        routes[reason] = routes.get(reason, 0) + 1
    cached = statistics.mean(records[rid]["cached_tokens"] for _, rid, _ in later)
    mean = statistics.mean(ttft for _, _, ttft in later)
    print(f"--routing {routing}: every conversation's turns 2+: mean TTFT {mean:.3f} s, landed on the first turn's instance "
          f"{landed}/{len(later)}, mean cached tokens {cached:.0f}, routes {routes}", flush=True)
    print(f"--routing {routing}: every conversation's turns 2+: {composition([records[rid] for _, rid, _ in later])}")
    return {"mean": mean, "landed": landed, "n": len(later), "replayed": replayed_mean}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--conversations", type=int, default=5, help="the replayed one and the independent ones")
    ap.add_argument("--max-tokens", type=int, default=16, help="of the replayed conversation's answers")
    ap.add_argument("--other-max-tokens", type=int, default=48, help="of the independent conversations' answers")
    ap.add_argument("--replayed-at", type=float, default=4.0,
                    help="seconds after the start when the replayed conversation begins (the independent ones: 1.5 s apart from 1.5 s)")
    ap.add_argument("--modes", nargs="+", choices=["prefix", "load"], default=["prefix", "load"],
                    help="the routings to run, one after the other (run one per process to run them side by side)")
    args = ap.parse_args()
    results = {mode: run_mode(mode, args) for mode in args.modes}
    if len(results) < 2:
        print(f"load average at the end: {os.getloadavg()[0]:.1f} (1 min)")
        return 0
    prefix, load = results["prefix"], results["load"]
    print(f"\nmean TTFT of the replayed conversation's turns 2-{args.turns}: prefix {prefix['replayed']:.3f} s ÷ "
          f"least-loaded {load['replayed']:.3f} s = {prefix['replayed'] / load['replayed']:.2f} (target <= 0.5)")
    print(f"every conversation's turns 2-{args.turns}: prefix {prefix['mean']:.3f} s ÷ least-loaded {load['mean']:.3f} s "
          f"= {prefix['mean'] / load['mean']:.2f}; landed on the prefix holder: "
          f"prefix {prefix['landed']}/{prefix['n']}, least-loaded {load['landed']}/{load['n']}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (1 min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
