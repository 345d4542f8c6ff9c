"""Cluster benchmark: real ``exo-p2p node`` processes on 127.0.0.1, one run, prints a table.

What is measured (all times by this process's monotonic clock):
- formation N (3, 5, 8): node 0 is started alone, then N-1 nodes with ``--bootstrap`` to it
  are spawned at once; from the moment the last API answers until every node reports the
  same master, term, last_event_idx, state_hash and N nodes in ``GET /state``. (A node's API
  answers only once it has joined or after 15 s, so "from spawn" is printed too.)
- failover: on the 5-node cluster, SIGKILL the master; until all survivors report the same
  new master in their replicated State.
- events/s through the master: 3 nodes, a 1-node synthetic-model instance on a follower,
  6 clients sending chat requests (max_tokens=1) to the master's API for 10 s; events/s =
  growth of the master's last_event_idx / seconds (each chat is a command plus runner/task
  events from the follower's worker, so this is end-to-end, not the sequencer alone).
- publish->apply latency: same kind of cluster, chats paced for ~20 events/s (``--rate``)
  for 15 s (``--seconds``). Every node records, per event index, when the master handed it
  to gossip and when each node finished applying it (``GET /debug/event-times``, seconds of
  CLOCK_MONOTONIC, comparable across processes on one host); latency of index k on a
  follower = applied_on_follower[k] - published_on_master[k], over both followers and every
  k published during the run. Indices published but never applied are counted and printed.
- catch-up: node 0's data dir is prepared with 100,000 events offered to a ``Replica``
  (compacting every 20,000 events as a live node does), node 0 is started, then a new node
  with ``--bootstrap``; from the new node's spawn and from its API answering until its
  last_event_idx and state_hash equal node 0's.

Usage: ``python scripts/bench_cluster.py [--skip-8] [--only PART ...] [--rate R] [--seconds S]``
(PART: formation, throughput, latency, catchup; all by default). A part that fails prints an
error row; the table of the other parts still prints.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.models.synthetic_models import make_synthetic_model  # noqa: E402
from exo_p2p.replica import Replica  # noqa: E402
from exo_p2p.types import IndexedEvent, TopologyEdge, TopologyEdgeCreated, TopologyEdgeDeleted  # noqa: E402
from tests.support.cluster import NodeProcess, agreement, nodes_cleanup, self_id, start_all, state_of, wait_until  # noqa: E402

MODEL = "tiny"


def form(base: Path, n: int, extra: list[str], nodes: list[NodeProcess]) -> tuple[float, float]:
    """Start ``n`` nodes by bootstrap; returns (seconds from last API answer, from spawn)."""
    name = f"bench-{n}-{time.monotonic_ns() % 10**9}"
    first = NodeProcess(base / "node0", cluster=name, extra_args=extra)
    nodes.append(first)
    first.start()
    boot = first.addrs()[0]
    rest = [NodeProcess(base / f"node{i}", cluster=name, extra_args=[*extra, "--bootstrap", boot]) for i in range(1, n)]
    nodes.extend(rest)
    t_spawn = time.monotonic()
    last_up = start_all(rest)
    wait_until(lambda: agreement(nodes, n), 60, interval=0.05, what=f"formation of {n}")
    t = time.monotonic()
    return t - last_up, t - t_spawn


def failover(nodes: list[NodeProcess]) -> float:
    ids = {self_id(n): n for n in nodes}
    old = wait_until(lambda: agreement(nodes), 30, what="agreement before the kill")[0]
    survivors = [n for i, n in ids.items() if i != old]
    t0 = time.monotonic()
    ids[old].kill()

    def agreed():
        ms = {(state_of(n, 2) or {}).get("master") for n in survivors}
        return len(ms) == 1 and None not in ms and old not in ms

    wait_until(agreed, 30, interval=0.02, what="new master")
    return time.monotonic() - t0


class Chats:
    """``clients`` threads posting chats to ``url`` (each at most ``rate`` per second; with a
    rate, client i starts i/(clients*rate) s late so the chats are spread evenly, not in step)."""

    def __init__(self, url: str, clients: int, rate: float | None) -> None:
        self.url, self.rate = url, rate
        self.ok = self.failed = 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i, clients), daemon=True) for i in range(clients)]

    def run(self, i: int, clients: int) -> None:
        if self.rate:
            self.stop.wait(i / (clients * self.rate))
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0}
        with httpx.Client(timeout=30) as c:
            while not self.stop.is_set():
                t = time.monotonic()
                try:
                    ok = c.post(self.url + "/v1/chat/completions", json=body).status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.ok += ok
                self.failed += not ok
                if self.rate:
                    self.stop.wait(max(0.0, 1 / self.rate - (time.monotonic() - t)))

    def __enter__(self) -> "Chats":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def prepare_log(data_dir: Path, n_events: int) -> None:
    """``n_events`` topology events (edges among 20 made-up node ids, created then deleted)
    offered to a Replica in ``data_dir`` exactly as a node applies them (compacting every
    20,000)."""
    replica = Replica(data_dir / "events.log", sync=False)
    fake = [f"bench-node-{i:02d}" for i in range(20)]
    for idx in range(1, n_events + 1):
        a, b = fake[idx % 20], fake[(idx * 7 + 3) % 20]
        event = TopologyEdgeCreated(TopologyEdge(a, b, "10.0.0.1")) if idx % 2 else TopologyEdgeDeleted(a, b)  # type: ignore[arg-type]
        replica.offer(IndexedEvent(term=1, idx=idx, event=event))  # type: ignore[arg-type]
    replica.close()


Row = tuple[str, str, str]


def part_formation(base: Path, extra: list[str], skip_8: bool) -> list[Row]:
    rows: list[Row] = []
    for n in (3, 5) if skip_8 else (3, 5, 8):
        nodes: list[NodeProcess] = []
        with nodes_cleanup(nodes):
            from_api, from_spawn = form(base / f"form{n}", n, extra, nodes)
            rows.append((f"formation of {n} (bootstrap)", f"{from_api:.2f} s", f"{from_spawn:.1f} s from spawn; target (3) <= 2 s"))
            print(rows[-1], flush=True)
            if n == 5:
                f = failover(nodes)
                rows.append(("master failover (SIGKILL, 5 nodes)", f"{f:.2f} s", "target <= 3 s"))
                print(rows[-1], flush=True)
    return rows


def serving_cluster(base: Path, extra: list[str], nodes: list[NodeProcess]) -> tuple[NodeProcess, list[NodeProcess]]:
    """3 nodes with a ready 1-node instance of the synthetic model on a follower; returns
    (master, followers)."""
    form(base, 3, extra, nodes)
    ids = {self_id(n): n for n in nodes}
    master_id = agreement(nodes)[0]
    master = ids[master_id]
    followers = [n for i, n in ids.items() if i != master_id]
    r = master.post("/instances", json={"model": MODEL, "nodes": [self_id(followers[0])]})
    assert r.status_code == 201, r.text
    iid = r.json()["instance_id"]
    wait_until(lambda: master.get(f"/instances/{iid}").json()["status"] == "ready", 120, what="instance ready")
    wait_until(lambda: agreement(nodes, 3), 30, what="settle")
    return master, followers


def part_throughput(base: Path, extra: list[str]) -> list[Row]:
    nodes: list[NodeProcess] = []
    with nodes_cleanup(nodes):
        master, _ = serving_cluster(base / "load", extra, nodes)
        i0, t0 = state_of(master)["last_event_idx"], time.monotonic()
        with Chats(master.url, clients=6, rate=None) as chats:
            time.sleep(10)
        i1, t1 = state_of(master)["last_event_idx"], time.monotonic()
        row = ("events/s through the master (chat load)", f"{(i1 - i0) / (t1 - t0):.1f} /s", f"{chats.ok} chats ok, {chats.failed} failed in {t1 - t0:.1f} s ({(i1 - i0) / max(1, chats.ok):.1f} events/chat)")
        print(row, flush=True)
        return [row]


def event_times(node: NodeProcess, since: int) -> dict:
    """``GET /debug/event-times?since=`` of ``node`` with integer keys."""
    doc = node.get(f"/debug/event-times?since={since}", timeout=10).json()
    return {kind: {int(k): v for k, v in doc[kind].items()} for kind in ("published", "received", "applied")}


def latency_samples(master_times: dict, follower_times: list[dict], first: int, last: int) -> tuple[list[float], int, int]:
    """Latencies (seconds) applied_on_follower[k] - published_on_master[k] for every index k
    in ``first..last`` the master published, over every follower; also how many indices
    were published in that range and how many (follower, index) pairs were never applied."""
    published = {k: t for k, t in master_times["published"].items() if first <= k <= last}
    samples: list[float] = []
    missing = 0
    for f in follower_times:
        for k, t in published.items():
            if k in f["applied"]:
                samples.append(f["applied"][k] - t)
            else:
                missing += 1
    return samples, len(published), missing


def part_latency(base: Path, extra: list[str], rate: float, seconds: float) -> list[Row]:
    nodes: list[NodeProcess] = []
    with nodes_cleanup(nodes):
        master, followers = serving_cluster(base / "latency", extra, nodes)
        # events per chat, measured with a few sequential chats
        i0 = state_of(master)["last_event_idx"]
        with Chats(master.url, clients=1, rate=2) as warm:
            time.sleep(3)
        wait_until(lambda: agreement(nodes, 3), 30, what="settle")
        per_chat = max(1.0, (state_of(master)["last_event_idx"] - i0) / max(1, warm.ok))
        i0 = state_of(master)["last_event_idx"]
        t0 = time.monotonic()
        with Chats(master.url, clients=2, rate=rate / per_chat / 2) as chats:
            time.sleep(seconds)
        t1 = time.monotonic()
        i1 = state_of(master)["last_event_idx"]
        wait_until(lambda: agreement(nodes, 3), 30, what="settle")
        lat, published, missing = latency_samples(event_times(master, i0 + 1), [event_times(f, i0 + 1) for f in followers], i0 + 1, i1)
        ms = [x * 1000 for x in lat]
        got = (i1 - i0) / (t1 - t0)
        note = f"{got:.1f} events/s for {t1 - t0:.0f} s ({chats.ok} chats, {per_chat:.1f} events/chat), {len(ms)} samples over 2 followers"
        if missing:
            note += f", {missing} (follower, index) never applied"
        if published < i1 - i0:
            note += f", {i1 - i0 - published} indices without a publish time"
        rows = [
            ("publish->apply latency p50 (3 nodes)", f"{pct(ms, 0.5):.1f} ms", note),
            ("publish->apply latency p99 (3 nodes)", f"{pct(ms, 0.99):.1f} ms", f"max {max(ms, default=float('nan')):.1f} ms; target <= 50 ms"),
        ]
        for r in rows:
            print(r, flush=True)
        return rows


def part_catchup(base: Path, extra: list[str]) -> list[Row]:
    nodes: list[NodeProcess] = []
    with nodes_cleanup(nodes):
        name = f"bench-catchup-{time.monotonic_ns() % 10**9}"
        t = time.monotonic()
        prepare_log(base / "catchup" / "node0", 100_000)
        prep = time.monotonic() - t
        first = NodeProcess(base / "catchup" / "node0", cluster=name, extra_args=extra)
        nodes.append(first)
        first.start(timeout=120)
        boot = first.addrs()[0]
        joiner = NodeProcess(base / "catchup" / "node1", cluster=name, extra_args=[*extra, "--bootstrap", boot])
        nodes.append(joiner)
        t_spawn = time.monotonic()
        joiner.start(timeout=120)
        t_up = time.monotonic()
        wait_until(lambda: agreement(nodes, 2), 120, interval=0.05, what="catch-up")
        t_done = time.monotonic()
        idx = state_of(first)["last_event_idx"]
        row = ("catch-up of a joining node after 100,000 events", f"{t_done - t_up:.2f} s", f"{t_done - t_spawn:.1f} s from spawn; log idx {idx}; log prepared in {prep:.1f} s; target <= 2 s")
        print(row, flush=True)
        return [row]


PARTS = ("formation", "throughput", "latency", "catchup")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--skip-8", action="store_true", help="formation: skip the 8-node cluster")
    parser.add_argument("--only", action="append", choices=PARTS, help="run only this part (repeatable); default all")
    parser.add_argument("--rate", type=float, default=20.0, help="latency: target events/s (default 20)")
    parser.add_argument("--seconds", type=float, default=15.0, help="latency: seconds of load (default 15)")
    args = parser.parse_args()
    parts = args.only or list(PARTS)
    rows: list[Row] = []
    base = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    models = base / "models"
    make_synthetic_model(models / MODEL, n_layers=2, seed=5)
    extra = ["--models-dir", str(models)]
    runs = {
        "formation": lambda: part_formation(base, extra, args.skip_8),
        "throughput": lambda: part_throughput(base, extra),
        "latency": lambda: part_latency(base, extra, args.rate, args.seconds),
        "catchup": lambda: part_catchup(base, extra),
    }
    failed = 0
    try:
        for part in PARTS:
            if part not in parts:
                continue
            try:
                rows.extend(runs[part]())
            except Exception as exc:  # noqa: BLE001 - report it and go on with the other parts
                failed += 1
                traceback.print_exc()
                rows.append((f"{part}: FAILED", "-", f"{type(exc).__name__}: {str(exc)[:200]}"))
    finally:
        shutil.rmtree(base, ignore_errors=True)

    width = max(len(r[0]) for r in rows)
    print()
    print(f"{'measure'.ljust(width)}  {'value':>10}  notes")
    for name, value, note in rows:
        print(f"{name.ljust(width)}  {value:>10}  {note}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
