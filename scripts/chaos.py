"""Chaos run: rounds of random faults against a 3-node cluster under a steady request load.

Real ``exo-p2p node`` processes on 127.0.0.1 (their own ports and data dirs), a tiny
synthetic model made here (no download), a 2-node instance placed on whichever nodes the
master chooses. Client threads send streaming chat requests, one after another, each to the
API of a node that is up. Every round injects one fault, chosen at random (``--seed``):

- ``kill_node``: SIGKILL of a non-master node process (not its runners); restarted with the
  same data dir after ``--down`` seconds.
- ``kill_master``: SIGKILL of the master's node process; restarted likewise.
- ``kill_runner``: SIGKILL of one runner subprocess of a random node.
- ``drop_link``: every libp2p TCP connection of a non-master node is reset (``ss -K``, root)
  again and again for ``--down`` seconds, so its peers see it gone and come back.

After each fault the round waits until the cluster has recovered (3 nodes agree, full mesh,
and an instance of the model is ready; when the master gave up re-placing, the script places
a new one, as a user would) before the next round.

Printed at the end:
- requests sent, completed, failed with an error (HTTP error status, SSE error event, or a
  transport error such as the API node itself being killed), hung; the failures split into
  those whose own API node was SIGKILLed while they were open (a transport error: nothing
  in the cluster can answer a connection to a dead process) and the cluster-side rest, and
  each failure listed with its time, node, the faults while it was open and its reason;
- hung: a request that did not end within its bound: the docs/architecture.md#defaults bound of the last
  fault injected while it was open plus 5 s (10 s for node/runner deaths, 15 s for a link),
  or 60 s without any fault. Must be 0;
- events lost (must be 0): a local event a node sent that never appears in the log. After
  the load stops and the cluster settles, each node's ``/state`` counter
  ``local_events_pending`` (sent, not yet seen indexed) must be 0, and in every node's
  on-disk event log the per-origin sequence numbers of each (origin, boot) are contiguous
  from 1 (a hole is a lost event);
- the worst time from a fault to the error of a request that was open when it happened;
- requests moved to another instance after a failure and requests that failed after one
  (``exo_p2p.api.generation.resume``), summed from every node's ``/state`` counters (sampled after each round, so a
  node killed before it was sampled loses its last few counts).

Usage: ``python scripts/chaos.py [--rounds N] [--seed S] [--clients C] [--down SECONDS]
[--layout pipeline|replicas] [--timeline]``: ``--layout replicas`` places two 1-node instances
on distinct nodes instead of one 2-node instance (instances on at least 2 nodes, so
a request can move to a ready instance at once); ``--timeline`` prints, after each round,
what changed in State since the fault (master, nodes, instances, runner statuses), to see
what a recovery spent its time on.
Needs root for ``drop_link`` (``ss -K``); without root that fault is left out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exo_p2p.api.generation.resume import MOVE_BOUND  # noqa: E402
from exo_p2p.eventlog import EventLog  # noqa: E402
from tests.support.models.synthetic_models import make_synthetic_model  # noqa: E402
from tests.support.cluster import (  # noqa: E402
    NodeProcess,
    agreement,
    full_mesh,
    kill_peer_connections,
    libp2p_port,
    nodes_cleanup,
    self_id,
    state_of,
    wait_until,
)

MODEL = "tiny"
#: docs/architecture.md#defaults: a request ends with an error within 10 s of a node or runner death, 15 s of
#: a link drop; the chaos run allows 5 s more (``SLACK``).
BOUND = {"kill_node": 10.0, "kill_master": 10.0, "kill_runner": 10.0, "drop_link": 15.0}
SLACK = 5.0
NO_FAULT_BOUND = 60.0


@dataclass
class Request:
    """One client request: monotonic start/end, outcome and the faults that hit it."""

    node: int
    started: float
    ended: float | None = None
    outcome: str = "open"  # completed | error | hung
    detail: str = ""
    wall: float = field(default_factory=time.time)
    """Wall-clock start (to find the request in the node logs)."""
    response_id: str = ""
    """The stream's ``id`` (names the request's first task), when one event came."""


@dataclass
class Fault:
    kind: str
    target: int
    at: float


@dataclass
class Run:
    """What the load threads and the fault loop share (guarded by ``lock``)."""

    nodes: list[NodeProcess]
    up: list[bool]
    requests: list[Request] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    layout: str = "pipeline"
    replicas: int = 2
    moves: dict[tuple[int, str], tuple[int, int]] = field(default_factory=dict)
    """(node index, node boot as its counters' base) → last seen (requests_moved, requests_move_failed)."""


def sample_moves(run: Run) -> None:
    """Record every up node's move counters (a restarted node starts from 0: a new key)."""
    for i, node in enumerate(run.nodes):
        s = state_of(node, timeout=2)
        if s is None or "requests_moved" not in s["counters"]:
            continue
        boot = str(node.proc.pid if node.proc is not None else 0)
        run.moves[(i, boot)] = (s["counters"]["requests_moved"], s["counters"]["requests_move_failed"])


def sse_lines(response: httpx.Response):
    """The lines of an SSE body, split at ``\n`` only as the SSE format says (httpx's
    ``iter_lines`` also splits at U+2028, U+0085, U+001C…, which a model's text may hold
    inside a JSON string: a chaos run counted such an event as a failed request)."""
    buf = b""
    for data in response.iter_bytes():
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode("utf-8", "replace")
    if buf:
        yield buf.rstrip(b"\r").decode("utf-8", "replace")


def one_request(run: Run, rng: random.Random, max_tokens: int) -> Request | None:
    """Send one streaming chat to a node that is up and record how it ended."""
    with run.lock:
        up = [i for i, u in enumerate(run.up) if u]
    if not up:
        time.sleep(0.2)
        return None
    i = rng.choice(up)
    req = Request(node=i, started=time.monotonic())
    with run.lock:
        run.requests.append(req)
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"chaos {rng.random()}"}], "max_tokens": max_tokens, "stream": True}
    # the read timeout is the hang detector: longer than any bound, so an open request that
    # gets no byte for this long is hung whatever the fault was
    timeout = httpx.Timeout(connect=5, read=max(BOUND.values()) + SLACK + 1, write=10, pool=5)
    finished = errored = False
    try:
        with httpx.stream("POST", run.nodes[i].url + "/v1/chat/completions", json=body, timeout=timeout) as r:
            if r.status_code != 200:
                errored, req.detail = True, f"HTTP {r.status_code}: {r.read()[:200]!r}"
            else:
                for line in sse_lines(r):
                    if time.monotonic() - req.started > NO_FAULT_BOUND + MOVE_BOUND + SLACK:
                        req.detail = "no end within the bound"
                        break
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        break
                    msg = json.loads(data)
                    req.response_id = req.response_id or str(msg.get("id", ""))
                    if "error" in msg:
                        errored, req.detail = True, str(msg["error"].get("message", ""))[:200]
                    elif any(c.get("finish_reason") for c in msg.get("choices", [])):
                        finished = True
    except httpx.TimeoutException as exc:
        req.detail = f"timeout: {exc!r}"
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        errored, req.detail = True, f"transport: {exc!r}"[:200]
    req.ended = time.monotonic()
    req.outcome = "error" if errored else "completed" if finished else "hung"
    return req


def load(run: Run, seed: int, max_tokens: int) -> None:
    rng = random.Random(seed)
    while not run.stop.is_set():
        req = one_request(run, rng, max_tokens)
        if req is not None and req.outcome == "error":
            time.sleep(0.5)  # a user retries after an error, not in a tight loop


class Timeline:
    """``--timeline``: what a recovery spent its time on. Samples the State of a node that is up
    every ``interval`` s and records, with the time since the last fault, each change of
    master/term, of the nodes listed, of an instance (created, failed, its reason) and of a
    runner's status; printed after each round (``print_round``)."""

    def __init__(self, run: Run, interval: float = 0.25) -> None:
        self.run = run
        self.interval = interval
        self.seen: dict[str, str] = {}
        self.lines: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.names = {self_id(n): f"n{j}" for j, n in enumerate(run.nodes)}  # ids survive restarts

    def _note(self, key: str, value: str, now: float) -> None:
        serving = ("ready", "running")
        if value in serving and self.seen.get(key) in serving:
            return  # a serving runner's ready <-> running is load, not recovery
        if self.seen.get(key) != value:
            self.seen[key] = value
            with self.lock:
                self.lines.append((now, f"{key}: {value}"))

    def sample(self) -> None:
        while not self.run.stop.is_set():
            with self.run.lock:
                up = [i for i, u in enumerate(self.run.up) if u]
            try:
                s = state_of(self.run.nodes[up[-1]], timeout=1) if up else None
            except httpx.HTTPError:
                s = None
            now = time.monotonic()
            if s is not None:
                names = self.names
                self._note("master", f"{names.get(s['master'], s['master'])} term {s['term']}", now)
                self._note("nodes", ",".join(sorted(names.get(n, n[:8]) for n in s["nodes"])), now)
                for iid, inst in s["instances"].items():
                    where = "+".join(names.get(sh["node_id"], "?") for sh in inst["shards"])
                    self._note(f"instance {iid[:8]}", f"on {where}" + (f" failed: {inst['failed_reason'][:90]}" if inst["failed_reason"] else ""), now)
                for rid, rec in s["runners"].items():
                    self._note(f"runner {rid[:8]}{rid[-3:]} on {names.get(rec['node_id'], '?')}", rec["status"]["kind"], now)
            time.sleep(self.interval)

    def print_round(self, since: float) -> None:
        with self.lock:
            lines = [(t, x) for t, x in self.lines if t >= since - 1.0]
            self.lines = [(t, x) for t, x in self.lines if t > time.monotonic() - 5]
        for t, x in lines:
            print(f"    {t - since:+6.1f} s  {x}", flush=True)


def master_index(run: Run) -> int | None:
    for i, node in enumerate(run.nodes):
        if not run.up[i]:
            continue
        s = state_of(node, timeout=3)
        if s and s["master"]:
            ids = {self_id(n): j for j, n in enumerate(run.nodes) if run.up[j]}
            return ids.get(s["master"])
    return None


def whole(nodes: list[NodeProcess], max_lag: int = 100) -> bool:
    """Under load the nodes' last indices move while they are sampled one after another, so
    equal hashes are only checked once the load stops; during the run the cluster is whole
    when all report the same master and term, State lists every node joined by a full mesh
    of edges, and their last indices are within ``max_lag`` events of each other."""
    ss = [state_of(n, timeout=3) for n in nodes]
    if any(s is None or s["master"] is None for s in ss):
        return False
    if len({(s["master"], s["term"]) for s in ss}) != 1:
        return False
    if any(len(s["nodes"]) != len(nodes) or not full_mesh(s) for s in ss):
        return False
    idx = [s["last_event_idx"] for s in ss]
    return max(idx) - min(idx) <= max_lag


def recover(run: Run, timeout: float) -> float:
    """Wait until 3 nodes agree and the layout's instances are ready (``run.layout``: one
    2-node instance, or ``replicas`` 1-node ones); when for 15 s fewer are on their way (none
    placed, or failed: the master gave up re-placing), place one, as a user would. Returns
    the seconds it took. Raises TimeoutError."""
    t0 = time.monotonic()
    wait_until(lambda: whole(run.nodes), timeout, interval=0.3, what="3 nodes agree on master and topology")
    api = run.nodes[0]
    deadline = t0 + timeout
    short_since: float | None = None
    want = 1 if run.layout == "pipeline" else run.replicas
    while time.monotonic() < deadline:
        views = [v for v in api.get("/instances", timeout=5).json() if v["model"] == MODEL]
        if sum(v["status"] == "ready" for v in views) >= want:
            return time.monotonic() - t0
        if sum(v["status"] != "failed" for v in views) >= want:
            short_since = None
        elif short_since is None:
            short_since = time.monotonic()
        elif time.monotonic() - short_since > 15:
            r = api.post("/instances", json=placement_body(run, views), timeout=30)
            print(f"  placed a new instance: HTTP {r.status_code}", flush=True)
            short_since = None
        time.sleep(0.5)
    raise TimeoutError(f"no ready instance: {api.get('/instances', timeout=5).text[:300]}")


def placement_body(run: Run, views: list[dict]) -> dict:
    """``POST /instances`` body for one more instance of the layout: a 2-node pipeline, or a
    1-node instance on a node that hosts none of the model's live instances yet (any node
    when every one does)."""
    if run.layout == "pipeline":
        return {"model": MODEL, "min_nodes": 2}
    used = {sh["node_id"] for v in views if v["status"] != "failed" for sh in v.get("shards", [])}
    ids = [self_id(n) for i, n in enumerate(run.nodes) if run.up[i]]
    free = [i for i in ids if i not in used]
    return {"model": MODEL, "min_nodes": 1, **({"nodes": [free[0]]} if free else {})}


def inject(run: Run, kind: str, rng: random.Random, down: float) -> Fault:
    """Inject one fault of ``kind`` and undo it (restart / reconnect) after ``down`` s."""
    m = master_index(run)
    others = [i for i in range(len(run.nodes)) if i != m and run.up[i]]
    if kind == "kill_master" and m is not None:
        target = m
    elif kind == "kill_runner":
        candidates = [i for i in range(len(run.nodes)) if run.up[i] and run.nodes[i].children()]
        target = rng.choice(candidates) if candidates else rng.choice(others)
    else:
        target = rng.choice(others)
    node = run.nodes[target]
    fault = Fault(kind, target, time.monotonic())
    with run.lock:
        run.faults.append(fault)
    if kind in ("kill_node", "kill_master"):
        with run.lock:
            run.up[target] = False
        node.kill()
        time.sleep(down)
        node.start(timeout=60)
        with run.lock:
            run.up[target] = True
    elif kind == "kill_runner":
        kids = node.children()
        if kids:
            rng.choice(kids).send_signal(signal.SIGKILL)
    elif kind == "drop_link":
        port = libp2p_port(node)
        until = time.monotonic() + down
        while time.monotonic() < until:
            kill_peer_connections(node, port)
            time.sleep(0.2)
    return fault


def is_hung(run: Run, req: Request) -> bool:
    """A request is hung when it never ended (read timeout), or ended later than the bound of
    docs/architecture.md#defaults + 5 s after the last fault injected while it was open (a
    request that completed, moved to another instance: that bound + the move bound), or later
    than 65 s after it started when no fault hit it."""
    if req.outcome == "hung" or req.ended is None:
        return True
    hits = [f for f in run.faults if req.started <= f.at <= req.ended]
    if hits:
        moved = MOVE_BOUND if req.outcome == "completed" else 0.0
        return req.ended - hits[-1].at > BOUND[hits[-1].kind] + moved + SLACK
    return req.ended - req.started > NO_FAULT_BOUND + SLACK


def own_node_killed(run: Run, req: Request) -> bool:
    """Whether ``req`` failed because its own API node was SIGKILLed while it was open (a
    transport error: the HTTP server the client talks to died; no cluster can answer that
    connection; a client retries on another node)."""
    if req.outcome != "error" or not req.detail.startswith("transport:") or req.ended is None:
        return False
    return any(f.kind in ("kill_node", "kill_master") and f.target == req.node and req.started - 1 <= f.at <= req.ended for f in run.faults)


def log_holes(data_dirs: list[Path]) -> int:
    """Holes in the per-origin sequence numbers of every (origin, boot) in each node's log:
    numbers missing between the smallest and the largest one seen (a log that starts from a
    snapshot holds no event below its base, so numbers below the smallest are not counted)."""
    holes = 0
    for d in data_dirs:
        path = d / "events.log"
        if not path.exists():
            continue
        seqs: dict[tuple[str, str], set[int]] = {}
        log = EventLog(path)
        try:
            for e in log:
                if e.origin:
                    seqs.setdefault((e.origin, e.origin_boot), set()).add(e.origin_seq)
        finally:
            log.close()
        for s in seqs.values():
            holes += max(s) - min(s) + 1 - len(s)
    return holes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--down", type=float, default=6.0, help="seconds a killed node stays down / a link stays cut")
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--layout", choices=["pipeline", "replicas"], default="pipeline",
                    help="pipeline: one 2-node instance; replicas: --replicas 1-node instances, each on its own node")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (node logs)")
    ap.add_argument("--timeline", action="store_true", help="after each round, print what changed in State since the fault (master, nodes, instances, runners)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    kinds = ["kill_node", "kill_master", "kill_runner"] + (["drop_link"] if os.geteuid() == 0 and shutil.which("ss") else [])
    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="exo-chaos-"))
    models = base / "models"
    make_synthetic_model(models / MODEL, n_layers=6, hidden_size=128, intermediate_size=256, seed=5)
    name = f"chaos-{os.getpid()}"
    nodes: list[NodeProcess] = []
    worst_fault_to_error = 0.0
    recoveries: list[float] = []
    pending_left = 0
    unrecovered = 0
    with nodes_cleanup(nodes):
        first = NodeProcess(base / "n0", cluster=name, extra_args=["--models-dir", str(models)])
        nodes.append(first)
        first.start()
        boot = first.addrs()[0]
        for i in (1, 2):
            n = NodeProcess(base / f"n{i}", cluster=name, extra_args=["--models-dir", str(models), "--bootstrap", boot])
            nodes.append(n)
            n.start()
        run = Run(nodes=nodes, up=[True] * 3, layout=args.layout, replicas=args.replicas)
        wait_until(lambda: whole(nodes), 60, what="cluster of 3")
        for _ in range(1 if args.layout == "pipeline" else args.replicas):
            views = [v for v in first.get("/instances", timeout=5).json() if v["model"] == MODEL]
            r = first.post("/instances", json=placement_body(run, views), timeout=30)
            assert r.status_code == 201, r.text
        print(f"cluster formed; instance ready in {recover(run, 120):.1f} s; {args.rounds} rounds of {kinds}", flush=True)
        threads = [threading.Thread(target=load, args=(run, args.seed * 100 + c, args.max_tokens), daemon=True) for c in range(args.clients)]
        timeline = Timeline(run) if args.timeline else None
        if timeline is not None:
            threads.append(threading.Thread(target=timeline.sample, daemon=True))
        for t in threads:
            t.start()
        t_start = time.monotonic()
        for r in range(args.rounds):
            time.sleep(rng.uniform(1.0, 3.0))
            kind = rng.choice(kinds)
            fault = inject(run, kind, rng, args.down)
            try:
                recover(run, 150)
                sample_moves(run)
                recoveries.append(time.monotonic() - fault.at)
                print(f"round {r + 1}: {kind} on node {fault.target}; recovered {time.monotonic() - fault.at:.1f} s after the fault", flush=True)
                if timeline is not None:
                    timeline.print_round(fault.at)
            except TimeoutError as exc:
                print(f"round {r + 1}: {kind} on node {fault.target}; NOT recovered: {exc}", flush=True)
                unrecovered += 1
                break
        run.stop.set()
        for t in threads:
            t.join(max(BOUND.values()) + MOVE_BOUND + SLACK + 5)
        sample_moves(run)
        elapsed = time.monotonic() - t_start
        # settle: every node's local events are indexed
        try:
            wait_until(lambda: agreement(nodes, 3) and all(state_of(n)["counters"].get("local_events_pending", 0) == 0 for n in nodes), 30, what="settled")
        except TimeoutError:
            pass
        for n in nodes:
            s = state_of(n) or {"counters": {}}
            pending_left += s["counters"].get("local_events_pending", 0)
            if "local_events_pending" not in s["counters"]:
                print("note: this node version does not report local_events_pending; only log holes are checked", flush=True)
                break
        for n in nodes:
            n.stop()
        holes = log_holes([n.data_dir for n in nodes])

    reqs = run.requests
    hung = 0
    for q in reqs:
        if is_hung(run, q):
            hung += 1
            print(f"  hung: node {q.node}, {(q.ended or time.monotonic()) - q.started:.1f} s, {q.outcome} {q.detail}", flush=True)
        elif q.outcome == "error" and q.ended is not None:
            hits = [f for f in run.faults if q.started <= f.at <= q.ended]
            if hits:
                worst_fault_to_error = max(worst_fault_to_error, q.ended - hits[-1].at)
    completed = sum(q.outcome == "completed" for q in reqs)
    failed = sum(q.outcome == "error" for q in reqs)
    own_killed = sum(own_node_killed(run, q) for q in reqs)
    rows = [
        ("rounds / faults", f"{len(run.faults)}", ", ".join(f.kind for f in run.faults)),
        ("rounds not recovered", str(unrecovered), "within 150 s; must be 0"),
        ("run time", f"{elapsed:.0f} s", f"{args.clients} clients, max_tokens {args.max_tokens}"),
        ("requests sent", str(len(reqs)), ""),
        ("completed", str(completed), ""),
        ("failed with an error", str(failed), f"{100 * failed / max(1, len(reqs)):.1f} % of those sent (target: <= 2 %); HTTP error, SSE error event or transport error"),
        ("  of which API node killed", str(own_killed), "transport error: the request's own API node was SIGKILLed while it was open"),
        ("  of which cluster side", str(failed - own_killed), f"{100 * (failed - own_killed) / max(1, len(reqs)):.1f} % of those sent: every other failure"),
        ("moved after a failure", str(sum(m for m, _ in run.moves.values())), "continuations accepted (node counters)"),
        ("failed after a failure", str(sum(f for _, f in run.moves.values())), "could not move or moved too often (node counters)"),
        ("hung", str(hung), "must be 0 (no end within the bound of docs/architecture.md#defaults + 5 s)"),
        ("events lost", str(pending_left + holes), f"pending after settle {pending_left}, log holes {holes}; must be 0"),
        ("worst fault -> error", f"{worst_fault_to_error:.1f} s", "bound 10 s (node/runner), 15 s (link)"),
        ("recovery (median / max)", f"{sorted(recoveries)[len(recoveries) // 2]:.1f} / {max(recoveries):.1f} s" if recoveries else "-", f"fault -> 3 nodes agree and an instance is ready (a killed node is down {args.down:.0f} s)"),
    ]
    kinds_of_error: dict[str, int] = {}
    for q in reqs:
        if q.outcome == "error":
            key = q.detail[:70]
            kinds_of_error[key] = kinds_of_error.get(key, 0) + 1
    for key, n in sorted(kinds_of_error.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  error x{n}: {key}")
    for q in [q for q in reqs if q.outcome == "error"][:40]:  # each failure, to find in the node logs
        at = time.strftime("%H:%M:%S", time.gmtime(q.wall))
        hits = [f"{f.kind} n{f.target} {f.at - q.started:+.1f} s" for f in run.faults if q.started - 2 <= f.at <= (q.ended or q.started)]
        why = "its API node was killed" if own_node_killed(run, q) else "cluster side"
        print(f"  failed ({why}): {at} UTC node {q.node} {q.response_id or '-'} [{', '.join(hits) or 'no fault while open'}]: {q.detail[:160]}")
    width = max(len(r[0]) for r in rows)
    print()
    for label, value, note in rows:
        print(f"{label:<{width}}  {value:>10}  {note}")
    if args.keep:
        print(f"logs in {base}")
    else:
        shutil.rmtree(base, ignore_errors=True)
    return 0 if hung == 0 and pending_left + holes == 0 and unrecovered == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
