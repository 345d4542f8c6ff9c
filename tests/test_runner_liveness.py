"""A busy runner is not a dead runner (worker/liveness.py, worker/runner/pulse.py), with real
node processes: a serving step slowed to 30 s (``--fault-hook slow_step=30``; a long prefill
chunk of a large model on a loaded machine) ends normally, its runner neither silent (its
heartbeat thread beats through the step) nor stuck (30 s is within the 45 s floor). A
stopped runner (tests/test_link_faults.py, SIGSTOP) and a wedged one (a dropped ring link
there; a stalled warm-up in tests/test_runner_churn.py) are still killed within their bounds.
"""

from __future__ import annotations

import time

import pytest

from exo_p2p.config import RUNNER_STEP_FLOOR
from tests.support.cluster import NodeProcess, state_of

pytestmark = pytest.mark.integration
MODEL = "tiny"
SLOW = 30.0
SLACK = 10.0  # 2 shared cores: the request's other steps and the API's own work


def test_a_30_s_step_is_served_and_its_runner_is_not_killed(tmp_path, models_dir):
    assert SLOW + 5 < RUNNER_STEP_FLOOR  # the fault stays clear of the floor it tests
    node = NodeProcess(tmp_path / "n", extra_args=["--max-moves", "0", "--models-dir", str(models_dir),
                                                   "--fault-hook", f"slow_step={SLOW:g}"])
    try:
        node.start()
        view = node.place_and_wait(MODEL, timeout=90)
        (runner,) = node.children()
        t0 = time.monotonic()
        r = node.chat("hello", MODEL, max_tokens=3, temperature=0)
        took = time.monotonic() - t0
        print(f"\nslowed step: answered in {took:.1f} s")
        assert r.status_code == 200, r.text
        assert SLOW - 1 <= took <= SLOW + SLACK, took
        # the same runner, alive and serving, its instance never failed
        assert runner.is_running() and [p.pid for p in node.children()] == [runner.pid]
        s = state_of(node)
        inst = s["instances"][view["instance_id"]]
        assert inst["failed_reason"] is None, inst
        assert {rec["status"]["kind"] for rec in s["runners"].values()} <= {"ready", "running"}, s["runners"]
        log = node.log_path.read_text(errors="replace")
        assert "runner silent" not in log and "runner stuck" not in log
        # and it goes on serving at its normal pace
        t0 = time.monotonic()
        assert node.chat("again", MODEL, max_tokens=3, temperature=0).status_code == 200
        assert time.monotonic() - t0 < SLACK
    finally:
        node.stop()
