"""Cancellation is agreed across ranks and always completes.

A 2-rank pipeline instance of the tiny synthetic model on 2 real node processes. A client
streams a long request (``max_tokens`` 1000) and closes the connection after 5 content
events; the API turns the disconnect into ``CancelGeneration``, every rank's runner receives
``CancelTask`` and the ranks agree on the step to stop at. Asserted per cancel: the task
leaves State on both nodes and both runners are back to Ready within 5 s of the close, the
task ended ``cancelled`` on both ranks (each supervisor's "runner task ended" log line), and
the completion tokens rank 0 reports are ≤ the tokens it had sent + 2. After 20 cancels: no
task left in State (count back to its baseline) and a normal greedy request returns 200 with
the same output as before the cancels. A cancel that reaches one rank
only is covered by tests/test_agreement.py (simulated ranks) and tests/test_pipeline.py
(real runners, cancel sent to rank 1 only); tests/test_sharded.py covers one cancel among
concurrent requests. Measured figures are printed (run with ``-s``).
"""

from __future__ import annotations

import json
import math
import time

import httpx
import pytest

from tests.support.cluster import Cluster, states, wait_until
from tests.support.cancel_bounds import cancel_bound

pytestmark = pytest.mark.integration
MODEL = "tiny"
STOP_BOUND = 5.0  # runners back to Ready within 5 s of the client closing (quiet speed; more if slower: below)
CYCLES = 20
READ_TOKENS = 5
LONG = 1000


def _stream_then_close(node, n_tokens: int) -> tuple[str, int, float, float]:
    """Stream a long greedy request and close the connection after ``n_tokens`` content
    events. Returns ``(task id, content events read, monotonic close time, seconds per token
    between the first content event and the close)``."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go on forever"}], "max_tokens": LONG, "temperature": 0, "stream": True}
    task_id, seen, first = None, 0, math.nan
    with httpx.stream("POST", node.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(30, connect=10)) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                assert line != "data: [DONE]", "the stream ended before it was cancelled"
                continue
            event = json.loads(line[len("data: "):])
            task_id = event["id"].removeprefix("chatcmpl-")
            assert event["choices"][0]["finish_reason"] is None, f"ended before the cancel: {event}"
            if event["choices"][0]["delta"].get("content"):
                seen += 1
                if seen == 1:
                    first = time.monotonic()
                if seen >= n_tokens:
                    break
    closed = time.monotonic()
    assert task_id is not None
    return task_id, seen, closed, (closed - first) / max(1, seen - 1)


def _task_end_lines(node, task_id: str) -> list[dict]:
    """The node's "runner task ended" log records for ``task_id`` (JSON log)."""
    out = []
    for line in node.log_path.read_text(errors="replace").splitlines():
        if task_id in line and "runner task ended" in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _stop_problem(cluster, iid: str, task_id: str, seen: dict) -> str | None:
    """What still shows that ``task_id`` has not stopped on both ranks, or None: on both
    nodes the task must be gone from State, every runner of ``iid`` Ready, and both ranks
    must have logged the task's end. Records in ``seen`` when the cancel request first shows
    in a State (``"requested"``, monotonic seconds)."""
    for n, s in zip(cluster.nodes, states(cluster.nodes)):
        record = s["tasks"].get(task_id)
        if record is not None and record["cancel_requested"]:
            seen.setdefault("requested", time.monotonic())
        if record is not None:
            return f"{n.data_dir.name}: task still in State: {record['status']}, cancel requested: {record['cancel_requested']}"
        kinds = [r["status"]["kind"] for r in s["runners"].values() if r["instance_id"] == iid]
        if kinds != ["ready", "ready"]:
            return f"{n.data_dir.name}: runners {kinds}"
    missing = [n.data_dir.name for n in cluster.nodes if not _task_end_lines(n, task_id)]
    return f"no task-end log line on {missing}" if missing else None


def _wait_stopped(cluster, iid: str, task_id: str, closed: float, timeout: float) -> dict:
    """Wait until ``task_id`` stopped on both ranks; returns ``{"requested": s, "stopped": s}``
    (seconds after ``closed``; "requested" when the cancel request was seen in State)."""
    deadline = closed + timeout
    seen: dict = {}
    problem = "not checked"
    while time.monotonic() < deadline:
        problem = _stop_problem(cluster, iid, task_id, seen)
        if problem is None:
            return {"requested": seen.get("requested", math.nan) - closed, "stopped": time.monotonic() - closed}
        time.sleep(0.05)
    requested = f"{seen['requested'] - closed:.2f} s" if "requested" in seen else "never seen"
    raise AssertionError(f"task {task_id} not stopped on both ranks within {timeout} s "
                         f"(cancel request in State after {requested}): {problem}")


def test_cancel_stops_both_ranks_and_twenty_cancels_leave_nothing_behind(tmp_path, models_dir):
    cluster = Cluster(tmp_path, 2, extra_args=["--models-dir", str(models_dir)])
    try:
        cluster.start()
        a, b = cluster.nodes
        iid = a.place_and_wait(MODEL, timeout=90, min_nodes=2)["instance_id"]  # both ranks ready
        assert len(a.get(f"/instances/{iid}").json()["shards"]) == 2

        def greedy():
            r = b.chat("hello there", MODEL, max_tokens=24, temperature=0)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["message"]["content"], r.json()["usage"]["completion_tokens"]

        reference = greedy()
        wait_until(lambda: all(s["tasks"] == {} for s in states(cluster.nodes)), 10, what="idle before the cancels")
        baseline = [len(s["tasks"]) for s in states(cluster.nodes)]

        stop_times, request_times, reported = [], [], []
        for i in range(CYCLES):
            task_id, seen, closed, per_token = _stream_then_close(a if i % 2 == 0 else b, READ_TOKENS)
            assert seen == READ_TOKENS
            # STOP_BOUND, or, if this stream decoded slowly, 2x the steps to the next agreement round
            timing = _wait_stopped(cluster, iid, task_id, closed, cancel_bound(per_token, STOP_BOUND))
            stop_times.append(timing["stopped"])
            request_times.append(timing["requested"])
            ends = [rec for n in cluster.nodes for rec in _task_end_lines(n, task_id)]
            assert sorted(rec["rank"] for rec in ends) == [0, 1], ends
            assert all(rec["status"] == "cancelled" for rec in ends), ends
            (rank0,) = [rec for rec in ends if rec["rank"] == 0]
            assert rank0["finish_reason"] == "cancelled"
            assert rank0["tokens_sent"] is not None and rank0["tokens_sent"] >= READ_TOKENS
            assert rank0["completion_tokens"] <= rank0["tokens_sent"] + 2, rank0
            assert rank0["completion_tokens"] < LONG
            reported.append((rank0["completion_tokens"], rank0["tokens_sent"]))

        # nothing left behind: no task (cancelled or otherwise) in State, on either node
        wait_until(lambda: [len(s["tasks"]) for s in states(cluster.nodes)] == baseline, 5, what="task count back to baseline")
        for s in states(cluster.nodes):
            assert not any(rec["cancel_requested"] for rec in s["tasks"].values())
            runners = [r for r in s["runners"].values() if r["instance_id"] == iid]
            assert [r["status"]["kind"] for r in runners] == ["ready", "ready"]
        assert len(a.children()) >= 1 and len(b.children()) >= 1  # the same runners still serve
        assert greedy() == reference
        print(f"\ncancels: {CYCLES} cancels, stop after close: max {max(stop_times):.2f} s, "
              f"mean {sum(stop_times) / len(stop_times):.2f} s; cancel request seen in State after: "
              f"{[round(t, 2) for t in request_times]} s; (reported, sent) tokens: {reported}")
    finally:
        cluster.stop()


def test_agreed_pace_is_the_smallest_proposal_and_the_same_on_every_rank():
    """The decode steps until the next round (``check_every``) are re-agreed every round: the
    smallest positive proposal wins on every rank, and no proposal keeps the current pace."""
    import numpy as np

    from worker.engine.agreement import LocalView, decide, encode_row
    from worker.runner.pace import MAX_CHECK_EVERY, check_every_for

    views = [LocalView(check_every=40), LocalView(check_every=7), LocalView(check_every=0)]
    rows = np.stack([encode_row(v) for v in views])
    assert {decide(v, rows).check_every for v in views} == {7}
    none = np.stack([encode_row(LocalView()), encode_row(LocalView())])
    assert decide(LocalView(), none).check_every == 0
    # a slower decode proposes fewer steps (a round stays ~CHECK_SECONDS apart), within bounds
    assert check_every_for(1000.0) == MAX_CHECK_EVERY
    assert check_every_for(30.0) > check_every_for(10.0) >= check_every_for(0.1) == 1
