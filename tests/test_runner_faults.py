"""The runner's test-only fault seam (``worker.runner.faults``), without a runner process."""

from __future__ import annotations

import pytest

from worker.runner.faults import NO_FAULTS, STALL_SECONDS, STAGE_LOADING, STAGE_WARMUP, RunnerFaults


def test_no_hooks_inject_nothing():
    slept: list[float] = []
    for stage in (STAGE_LOADING, STAGE_WARMUP):
        NO_FAULTS.at(stage, sleep=slept.append)
    assert slept == [] and NO_FAULTS.ring_addresses(["10.0.0.1:1"]) == ["10.0.0.1:1"]
    assert RunnerFaults.from_hooks({}) == NO_FAULTS


def test_stall_hangs_only_at_its_stage():
    faults = RunnerFaults.from_hooks({"stall": "warmup"})
    slept: list[float] = []
    faults.at(STAGE_LOADING, sleep=slept.append)
    assert slept == []
    faults.at(STAGE_WARMUP, sleep=slept.append)
    assert slept == [STALL_SECONDS]


def test_fail_raises_at_loading_and_ring_drops_the_host_list():
    with pytest.raises(RuntimeError, match="failure during load"):
        RunnerFaults.from_hooks({"fail": "loading"}).at(STAGE_LOADING)
    assert RunnerFaults.from_hooks({"ring": "no_hostfile"}).ring_addresses(["a"]) is None
