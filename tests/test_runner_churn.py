"""Runner churn and runner stalls.

- ``test_planner_stays_idempotent_under_runner_churn``: a 3-node pipeline instance of
  the tiny synthetic model (3 nodes, not 4: the machine has 2 shared CPU cores).
  Every node runs with a ``--memory-limit`` under which the model fits only on all 3 nodes
  together, so each automatic re-placement is again a 3-rank instance whose runners go
  through Connecting. Node C's runner is killed (SIGKILL, by the PID its node logged) 3 times
  in a row, each time as soon as ``/state`` shows it Connecting (or, when the poll misses
  that short status, at the first status after it). A sampler checks ``/state`` and the
  process table throughout; chat requests are sent throughout and must each end within the
  docs/architecture.md#defaults bound. Then the last re-placement (the 3rd and last allowed) must converge.
- ``test_plan_under_churn_returns_one_task_and_never_recreates_a_killed_runner``: the
  worker's pure ``plan`` over the churn sequence (same input twice → the same single task;
  a killed runner is never re-created or re-sent a task; its successor is created once).
  tests/test_plan.py already covers idempotence in general; this covers the churn steps.
- ``test_runner_stalled_in_warmup_is_killed_as_stuck_and_fails``
  (tests/test_faults.py covers death and failure in load, not a stall): a runner blocked in
  warm-up (``--fault-hook stall=warmup``) keeps its heartbeat thread beating and is killed as
  stuck after 60 s without a warm-up step ending (``worker.liveness``, docs/architecture.md#defaults),
  fails with the reason in State and the API, requests meanwhile end with an error, and the
  master re-places the instance by the normal rules.
"""

from __future__ import annotations

import collections
import json
import math
import os
import signal
import threading
import time

import httpx
import msgspec
import psutil
import pytest

from exo_p2p.models.card.derive import card_from_model_dir
from tests.support.models.synthetic_models import make_synthetic_model
from exo_p2p.types import (
    CreateRunner,
    Instance,
    RunnerConnecting,
    RunnerFailed,
    RunnerIdle,
    RunnerRecord,
    ShardMetadata,
    State,
)
from tests.conftest import T_FAIL
from tests.support.cluster import Cluster, NodeProcess, wait_until
from worker.plan import LocalRunner, plan

MODEL = "tiny"
NO_MOVES = ["--max-moves", "0"]  # this test checks the bounded error path; moves (exo_p2p.api.generation.resume) are tested in test_resume*
SILENT_LOADING = 60.0  # exo_p2p.config.RUNNER_UNIT_BOUND: runner killed as stuck when warm-up makes no progress this long
SLACK = 10.0  # 2 shared, loaded cores: process start-up and MLX imports take seconds
KILLS = 3
CONVERGE_WAIT = 120.0  # seconds for the last re-placement to be ready (a model load: generous)
RUNNER_MODULE = "worker.runner.main"
DEAD = ("shutdown", "failed")


BIG = "tiny-wide"


@pytest.fixture(scope="module")
def big_models_dir(tmp_path_factory):
    """A still small (~160 MB, float32) model: ``--memory-limit`` takes at least 64 MiB, so a
    model that needs all 3 nodes under such a limit must weigh more than 2 × 64 MiB / 1.1."""
    d = tmp_path_factory.mktemp("big")
    make_synthetic_model(d / BIG, n_layers=10, hidden_size=512, intermediate_size=2048, seed=7)
    return d


# --- helpers ------------------------------------------------------------------------------------


def _state(node: NodeProcess) -> dict | None:
    try:
        r = node.get("/state", timeout=5)
        return r.json() if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


def _self_id(node: NodeProcess) -> str:
    return next(n["node_id"] for n in node.get("/nodes").json() if n["is_self"])


def _logged(node: NodeProcess, event: str) -> list[dict]:
    """The node's JSON log records whose ``event`` is ``event``."""
    out = []
    for line in node.log_path.read_text(errors="replace").splitlines():
        if event in line:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("event") == event:
                out.append(rec)
    return out


def _runner_processes(node: NodeProcess) -> list[psutil.Process]:
    """The node's live runner subprocesses (not their ring-init watchdogs)."""
    out = []
    for p in node.children():
        try:
            if RUNNER_MODULE in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out


def state_violations(state: dict, n_nodes: int) -> list[str]:
    """The churn invariants on one ``GET /state`` sample: ≤ 1 live runner per (instance, node);
    per instance ≤ ``n_nodes`` live runners plus ≤ 1 ShuttingDown per node."""
    problems = []
    live: collections.Counter = collections.Counter()
    shutting: collections.Counter = collections.Counter()
    per_instance: collections.Counter = collections.Counter()
    for r in state["runners"].values():
        kind = r["status"]["kind"]
        if kind in DEAD:
            continue
        if kind == "shutting_down":
            shutting[(r["instance_id"], r["node_id"])] += 1
        else:
            live[(r["instance_id"], r["node_id"])] += 1
            per_instance[r["instance_id"]] += 1
    problems += [f"{n} live runners of {k}" for k, n in live.items() if n > 1]
    problems += [f"{n} shutting-down runners of {k}" for k, n in shutting.items() if n > 1]
    problems += [f"{n} live runners for instance {i}" for i, n in per_instance.items() if n > n_nodes]
    return problems


class Sampler:
    """Samples ``/state`` of ``nodes`` and their runner processes in a thread until stopped,
    recording every invariant violation and the largest counts seen."""

    def __init__(self, nodes: list[NodeProcess], interval: float = 0.15) -> None:
        self.nodes = nodes
        self.interval = interval
        self.samples = 0
        self.violations: list[str] = []
        self.max_runner_procs = 0
        self.max_runner_records = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        n = len(self.nodes)
        while not self._stop.is_set():
            for node in self.nodes:
                s = _state(node)
                if s is not None:
                    self.samples += 1
                    self.violations += [f"{node.data_dir.name}: {v}" for v in state_violations(s, n)]
                    alive = [r for r in s["runners"].values() if r["status"]["kind"] not in DEAD]
                    self.max_runner_records = max(self.max_runner_records, len(alive))
                # at most one runner starting or serving, plus one being shut down, per node
                procs = len(_runner_processes(node))
                self.max_runner_procs = max(self.max_runner_procs, procs)
                if procs > 2:
                    self.violations.append(f"{node.data_dir.name}: {procs} runner processes")
            self._stop.wait(self.interval)


class ChatLoad:
    """Sends small non-streaming chat requests to ``node`` one after another in a thread,
    recording ``(status or error, seconds)`` for each."""

    def __init__(self, node: NodeProcess, model: str, bound: float) -> None:
        self.node = node
        self.model = model
        self.bound = bound
        self.results: list[tuple[object, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "ChatLoad":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(self.bound + 15)

    def _run(self) -> None:
        body = {"model": self.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                r = httpx.post(self.node.url + "/v1/chat/completions", json=body, timeout=self.bound + 20)
                outcome: object = r.status_code
            except httpx.HTTPError as exc:
                outcome = type(exc).__name__
            self.results.append((outcome, time.monotonic() - t0))
            self._stop.wait(0.3)


# --- runner churn -----------------------------------------------------------------------------


@pytest.mark.integration
def test_planner_stays_idempotent_under_runner_churn(tmp_path, big_models_dir):
    storage = card_from_model_dir(big_models_dir / BIG, BIG).storage_size
    required = math.ceil(storage * 11 / 10)
    limit = int(required * 0.45)  # 2 nodes: 0.9 × required (too little); 3 nodes: 1.35 ×
    assert limit >= 64 * 2**20, (storage, limit)
    cluster = Cluster(tmp_path, 3, extra_args=[*NO_MOVES, "--models-dir", str(big_models_dir), "--memory-limit", str(limit)])
    try:
        cluster.start()
        api, _, victim = cluster.nodes
        victim_id = _self_id(victim)
        r = api.post("/instances", json={"model": BIG})  # min_nodes 1: only 3 nodes fit anyway
        assert r.status_code == 201, r.text
        first = r.json()["instance_id"]
        assert len(api.get(f"/instances/{first}").json()["shards"]) == 3

        killed: list[tuple[str, str, float]] = []  # (runner id, status seen, monotonic time)
        with Sampler(cluster.nodes) as sampler, ChatLoad(api, BIG, T_FAIL + SLACK) as load:
            for k in range(KILLS):
                rid, seen = _wait_for_victim_runner(victim, victim_id, {r for r, _, _ in killed}, timeout=90)
                pid = _runner_pid(victim, rid)
                os.kill(pid, signal.SIGKILL)
                killed.append((rid, seen, time.monotonic()))
            t_last = killed[-1][2]

            # converges: the last allowed re-placement reaches Ready (or the model is given up)
            def settled():
                s = _state(api)
                if s is None or not s["instances"]:
                    return None
                (inst,) = s["instances"].values()
                if inst["gave_up"]:
                    return inst, "failed"
                view = api.get(f"/instances/{inst['instance_id']}").json()
                return (inst, "ready") if view["status"] == "ready" else None

            # generous (docs/testing.md): the last re-placement starts 3 runners that import MLX,
            # load, form their ring and warm up; 30 s was too short with the machine's 2 cores
            # shared by 3 test workers and other runs (load 10): only a hang must fail here
            inst, outcome = wait_until(settled, CONVERGE_WAIT, interval=0.2, what="instance converged")
            t_settled = time.monotonic() - t_last
            # ShuttingDown runners reached a terminal state; nothing of old instances is alive
            def quiet():
                s = _state(api)
                return s is not None and all(
                    r["status"]["kind"] in DEAD or r["instance_id"] == inst["instance_id"] for r in s["runners"].values()
                )

            wait_until(quiet, T_FAIL, what="old runners terminal")
            time.sleep(1.0)  # a few more samples and requests after convergence

        assert sampler.samples > 50, sampler.samples
        assert not sampler.violations, sampler.violations[:10]
        # every chat request ended (success or error) within the bound: none hung
        assert load.results, "no request was sent during the churn"
        slow = [(o, round(t, 1)) for o, t in load.results if t > T_FAIL + SLACK]
        assert not slow, slow
        assert all(o in (200, 409, 503) for o, _ in load.results), collections.Counter(o for o, _ in load.results)
        # no runner id was ever created twice on any node (plan never re-sends CreateRunner)
        for node in cluster.nodes:
            started = collections.Counter(rec["runner_id"] for rec in _logged(node, "runner started"))
            assert all(n == 1 for n in started.values()), started
        # the killed runners were node C's, of 3 successive instances
        assert len({rid.rsplit("-r", 1)[0] for rid, _, _ in killed}) == KILLS
        # runners that failed by themselves (not our SIGKILL, not a shutdown) also use attempts
        own = [rec for n in cluster.nodes for rec in _logged(n, "runner exited") if rec["status"] == "failed" and rec["code"] != -9]
        if not own:
            # only our kills: the last allowed re-placement (attempt 3) serves
            assert inst["attempt"] == KILLS and outcome == "ready", inst
            assert [len(_runner_processes(n)) for n in cluster.nodes] == [1, 1, 1]
            r = api.chat("hello", BIG, max_tokens=5, temperature=0)
            assert r.status_code == 200, r.text
        else:  # the attempts ran out: given up with the reason, nothing left running
            assert outcome == "failed" and "gave up after 3" in inst["failed_reason"], (inst, own)
            wait_until(lambda: all(not _runner_processes(n) for n in cluster.nodes), T_FAIL, what="no runner left")
        print(
            f"\nrunner churn: killed at statuses {[s for _, s, _ in killed]}; {outcome} (attempt {inst['attempt']}, "
            f"{len(own)} other runner failures) {t_settled:.1f} s after the last kill; "
            f"{sampler.samples} samples, max live runner records {sampler.max_runner_records}, "
            f"max runner processes on one node {sampler.max_runner_procs}; requests: "
            f"{dict(collections.Counter(o for o, _ in load.results))}, slowest {max(t for _, t in load.results):.1f} s"
        )
        # killed ranks make their peers' MLX ring write C-level lines to fd 2: with JSON logs
        # the supervisor relays them as JSON records too (worker.runner_output)
        ring_records = 0
        for node in cluster.nodes:
            for number, line in enumerate(node.log_path.read_text(errors="replace").splitlines(), 1):
                try:
                    record = json.loads(line)
                except ValueError:
                    pytest.fail(f"{node.log_path} line {number} is not JSON: {line!r}")
                ring_records += isinstance(record, dict) and str(record.get("line", "")).startswith("[ring]")
        print(f"ring output records (C-level, relayed as JSON): {ring_records}")
    finally:
        cluster.stop()


def _wait_for_victim_runner(node: NodeProcess, node_id: str, done: set[str], timeout: float) -> tuple[str, str]:
    """Poll ``node``'s ``/state`` quickly for the runner on ``node_id`` of a live instance not
    already killed; returns ``(runner id, status)`` once it is Connecting, or — when the poll
    missed that status — at the first status after it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = _state(node)
        if s is not None:
            for inst in s["instances"].values():
                if inst["failed_reason"] is not None:
                    continue
                shard = next((sh for sh in inst["shards"] if sh["node_id"] == node_id), None)
                if shard is None or shard["runner_id"] in done:
                    continue
                record = s["runners"].get(shard["runner_id"])
                if record is not None and record["status"]["kind"] != "idle":
                    return shard["runner_id"], record["status"]["kind"]
        time.sleep(0.02)
    raise TimeoutError(f"no new runner on the victim node within {timeout} s:\n{node.log_tail()}")


def _runner_pid(node: NodeProcess, runner_id: str, timeout: float = 5.0) -> int:
    """The PID ``node`` logged when it started ``runner_id`` ("runner started")."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for rec in _logged(node, "runner started"):
            if rec.get("runner_id") == runner_id:
                return int(rec["pid"])
        time.sleep(0.05)
    raise TimeoutError(f"no 'runner started' log line for {runner_id}")


# --- the pure planner over the churn sequence ------------------------------------------------------

NODE, BOOT = "node-c", "boot-c"


def _instance(instance_id: str, attempt: int = 0, replaces: str | None = None) -> Instance:
    nodes = ("node-a", "node-b", NODE)
    shards = tuple(
        ShardMetadata(n, f"{instance_id}-r{r}", r, 3, 2 * r, 2 * r + 2, 6, 100, BOOT if n == NODE else "boot-x", f"127.0.0.1:{5000 + r}")
        for r, n in enumerate(nodes)
    )
    return Instance(instance_id, "m", "pipeline", shards, replaces=replaces, attempt=attempt)


def test_plan_under_churn_returns_one_task_and_never_recreates_a_killed_runner():
    i0 = _instance("i0")
    rid0 = "i0-r2"
    s = State(instances={"i0": i0})
    # the same input twice: the same single task (create this node's runner)
    assert plan(NODE, BOOT, s, {}) == plan(NODE, BOOT, s, {}) == CreateRunner(instance=i0, shard=i0.shards[2])
    # Connecting, then killed: State still shows Connecting while the node already knows
    local = {rid0: LocalRunner(rid0, "i0", RunnerFailed("runner process was killed by signal 9"), frozenset({"connect"}))}
    s = msgspec.structs.replace(s, runners={rid0: RunnerRecord(rid0, "i0", NODE, RunnerConnecting())})
    assert plan(NODE, BOOT, s, local) is None and plan(NODE, BOOT, s, local) is None
    # the instance failed (its other runners are shut down elsewhere): nothing to do here
    failed = msgspec.structs.replace(i0, failed_reason="runner on node-c failed")
    s = msgspec.structs.replace(s, instances={"i0": failed})
    assert plan(NODE, BOOT, s, local) is None
    # re-placed: exactly one CreateRunner for the successor's shard, the same on every call
    i1 = _instance("i1", attempt=1, replaces="i0")
    s = State(instances={"i1": i1})
    expected = CreateRunner(instance=i1, shard=i1.shards[2])
    assert plan(NODE, BOOT, s, local) == plan(NODE, BOOT, s, local) == expected
    # once created (its supervisor is in ``local``), never created again
    local = {**local, "i1-r2": LocalRunner("i1-r2", "i1", RunnerIdle())}
    assert plan(NODE, BOOT, s, local) is None  # waits for the other ranks' runners, creates nothing
    # a second kill of the successor, before State knows: still nothing re-created or re-sent
    local = {**local, "i1-r2": LocalRunner("i1-r2", "i1", RunnerFailed("killed"), frozenset({"connect"}))}
    assert plan(NODE, BOOT, s, local) is None


# --- a runner stalled in warm-up -------------------------------------------------------------------


@pytest.mark.integration
def test_runner_stalled_in_warmup_is_killed_as_stuck_and_fails(tmp_path, models_dir):
    node = NodeProcess(tmp_path / "n", extra_args=["--models-dir", str(models_dir), "--fault-hook", "stall=warmup"])
    try:
        node.start()
        r = node.post("/instances", json={"model": MODEL})
        assert r.status_code == 201, r.text
        iid = r.json()["instance_id"]
        rid = f"{iid}-r0"

        def warming_up():
            s = _state(node)
            rec = s and s["runners"].get(rid)
            return rec is not None and rec["status"]["kind"] == "warming_up"

        wait_until(warming_up, 60, interval=0.1, what="runner warming up")
        t_stall = time.monotonic()
        pid = _runner_pid(node, rid)
        # a request meanwhile ends at once with an error (503 while loading), never a hang
        t0 = time.monotonic()
        r = node.chat("hi", MODEL, max_tokens=3)
        assert r.status_code == 503 and time.monotonic() - t0 < 5, (r.status_code, r.text)

        def failed():
            """The runner's Failed record in State and the instance's failed API view, seen
            in the moment between the failure and the re-placement (its 1 s backoff)."""
            view = node.get(f"/instances/{iid}", timeout=5)
            s = _state(node)
            rec = s and s["runners"].get(rid)
            if view.status_code == 200 and view.json()["status"] == "failed" and rec and rec["status"]["kind"] == "failed":
                return rec, view.json()
            assert s is None or iid in s["instances"], "the failed instance was replaced before the poll saw it fail"
            return None

        rec, view = wait_until(failed, SILENT_LOADING + SLACK, interval=0.1, what="stalled runner failed")
        took = time.monotonic() - t_stall
        assert SILENT_LOADING - 1 <= took <= SILENT_LOADING + SLACK, took
        # its heartbeat thread kept beating: not silent, but stuck in one unit of work
        assert "stuck" in rec["status"]["error"] and "warming_up" in rec["status"]["error"], rec
        assert "no progress" in rec["status"]["error"], rec
        assert "stuck" in view["reason"] and view["shards"][0]["status"] == "failed", view
        wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 5, what="stalled runner killed")

        # the instance failed with the reason, and the master re-places it (normal rules: a new
        # instance replacing it, attempt 1, after the backoff)
        def replaced():
            s = _state(node)
            return next((i for i in (s or {}).get("instances", {}).values() if i["replaces"] == iid), None)

        new = wait_until(replaced, T_FAIL, what="re-placement")
        assert new["attempt"] == 1 and new["failed_reason"] is None
        view = node.get(f"/instances/{new['instance_id']}").json()
        assert view["status"] == "loading"
        assert iid not in node.get("/state").json()["instances"]  # the failed one was replaced
        failed_lines = [rec for rec in _logged(node, "runner stuck; killing it") if rec.get("runner_id") == rid]
        assert failed_lines and f"bound {SILENT_LOADING:g} s" in failed_lines[0]["reason"], failed_lines
        print(f"\nstall in warm-up: runner failed {took:.1f} s after it began warming up; re-placed as attempt {new['attempt']}")
    finally:
        node.stop()
