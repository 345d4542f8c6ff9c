"""A dead runner's instance is never chosen again, and with no healthy
instance left a request gets a 503 at once (docs/architecture.md#instance-lifecycle).

One node serves two 1-node instances I1, I2 of the tiny model. I1's runner is aborted
(SIGABRT) while idle; once its failure is in State, 5 sequential requests all succeed and
every one is served by I2 (the node log's "runner task ended" lines name the runner); then
I2's runner is aborted too: the next request ends with a 503 within T_FAIL and no task is
left in State. The window between a runner's death and its failure reaching State (~0.1 s
here) is covered by tests/test_faults.py: a request routed into it ends with an error."""

from __future__ import annotations

import json
import signal
import time

import psutil
import pytest

from tests.conftest import T_FAIL, tiny_models_dir
from tests.support.cluster import NodeProcess, wait_until

pytestmark = pytest.mark.integration
MODEL = "tiny"
SLACK = 3.0


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tiny_models_dir(tmp_path_factory, n_layers=4, hidden_size=64, intermediate_size=128, seed=7)


def _log_records(node: NodeProcess, event: str) -> list[dict]:
    out = []
    for line in node.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"{event}"' in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _runner_pid(node: NodeProcess, instance_id: str) -> int:
    """The PID of the live runner of ``instance_id`` (from the node's "runner started" log)."""
    for rec in reversed(_log_records(node, "runner started")):
        if rec.get("runner_id", "").startswith(instance_id) and psutil.pid_exists(rec["pid"]):
            return rec["pid"]
    raise AssertionError(f"no live runner of {instance_id}")


def _failed(node: NodeProcess, instance_id: str) -> bool:
    inst = node.get("/state", timeout=5).json()["instances"].get(instance_id)
    return inst is None or inst["failed_reason"] is not None


def test_dead_instance_is_never_chosen_and_none_left_gives_503(tmp_path, models_dir):
    node = NodeProcess(tmp_path / "n", extra_args=["--models-dir", str(models_dir)])
    try:
        node.start()
        i1 = node.place_and_wait(MODEL, timeout=60)["instance_id"]
        i2 = node.place_and_wait(MODEL, timeout=60)["instance_id"]
        assert i1 != i2
        pid1 = _runner_pid(node, i1)
        t_kill = time.monotonic()
        psutil.Process(pid1).send_signal(signal.SIGABRT)
        wait_until(lambda: _failed(node, i1), T_FAIL, interval=0.05, what="I1's failure in State")
        print(f"\nI1 failed in State {time.monotonic() - t_kill:.2f} s after SIGABRT")
        before = len(_log_records(node, "runner task ended"))
        for k in range(5):
            r = node.chat(f"question {k}", MODEL, max_tokens=4, temperature=0)
            assert r.status_code == 200, r.text
        # the runner reports the task's end just after its last chunk, which already ended
        # the HTTP response: its log line may come a moment after the response
        wait_until(lambda: len(_log_records(node, "runner task ended")) >= before + 5, SLACK,
                   interval=0.05, what="5 'runner task ended' lines")
        ended = _log_records(node, "runner task ended")[before:]
        assert len(ended) == 5, ended
        assert all(rec["runner_id"].startswith(i2) for rec in ended), [rec["runner_id"] for rec in ended]
        # I2 dies too: nothing healthy is left (I1's re-placement may be loading): 503 at once
        pid2 = _runner_pid(node, i2)
        psutil.Process(pid2).send_signal(signal.SIGABRT)
        wait_until(lambda: _failed(node, i2), T_FAIL, interval=0.05, what="I2's failure in State")
        t0 = time.monotonic()
        before = len(_log_records(node, "runner task ended"))
        r = node.chat("anyone?", MODEL, max_tokens=4, timeout=T_FAIL + SLACK)
        took = time.monotonic() - t0
        if r.status_code == 200:
            # a re-placement became ready in the meantime and served it: fine, but it must be
            # a new instance, never one of the dead two
            wait_until(lambda: len(_log_records(node, "runner task ended")) > before, SLACK,
                       interval=0.05, what="the 'runner task ended' line")
            (rec,) = _log_records(node, "runner task ended")[before:]
            assert not rec["runner_id"].startswith((i1, i2)), rec
        else:
            assert r.status_code == 503, r.text
            assert took <= T_FAIL + SLACK, took
            err = r.json()["error"]
            assert err["type"] == "server_error" and ("no healthy instance" in err["message"] or "loading" in err["message"]), err
        assert node.get("/state").json()["tasks"] == {}  # no task left pending for a dead instance
        for pid in (pid1, pid2):  # reaped by the supervisor: no zombie left
            wait_until(lambda: not psutil.pid_exists(pid), 5, what=f"runner {pid} reaped")
    finally:
        node.stop()
