"""Runner liveness as pure rules (worker/liveness.py, worker/runner/pulse.py): a busy runner
is not a dead runner. The processes are in tests/test_runner_liveness.py and
tests/test_link_faults.py (SIGSTOP, a wedged ring)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exo_p2p.config import RUNNER_STEP_FACTOR, RUNNER_STEP_FLOOR, RUNNER_UNIT_BOUND
from worker.liveness import LivenessBounds, liveness_fault, own_stall, silence_bound, step_bound, stuck_reason
from worker.runner.faults import RunnerFaults
from worker.runner.protocol import MAX_FRAME, FrameReader, FrameTooLarge, HeartbeatMsg, frame, to_supervisor_decoder
from worker.runner.pulse import Pulse, heartbeat_loop

BOUNDS = {"floor": RUNNER_STEP_FLOOR, "factor": RUNNER_STEP_FACTOR, "unit_bound": RUNNER_UNIT_BOUND}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_silence_bounds_are_the_documented_ones():
    assert silence_bound("loading", generating=10, loading=60) == 60
    assert silence_bound("warming_up", generating=10, loading=60) == 60
    assert silence_bound("running", generating=10, loading=60) == 10
    assert silence_bound("ready", generating=10, loading=60) == 10


def test_the_nodes_own_stall_is_not_a_runners_silence_up_to_one_bound():
    """The node SIGSTOPped 10 s read nothing from its runner: 11 s of silence, 10.2 s of them
    its own stall, is 0.8 s of the runner's (live). The credit is capped at one bound: a
    runner silent 21 s is killed however long the node says it stalled."""
    bounds = LivenessBounds()
    assert liveness_fault("running", 11.0, None, 0.0, bounds, own_stall=10.2) is None
    assert liveness_fault("running", 11.0, None, 0.0, bounds).kind == "silent"  # without the rule
    assert liveness_fault("running", 21.0, None, 0.0, bounds, own_stall=15.0).kind == "silent"
    # woken from a 20 s stop: it listens 2 s (two runner beats) before it judges
    assert liveness_fault("running", 21.0, None, 0.0, bounds, own_stall=20.0) is None
    assert liveness_fault("running", 22.0, None, 0.0, bounds, own_stall=20.0).kind == "silent"
    assert liveness_fault("running", 5.0, None, 0.0, bounds, own_stall=-3.0) is None  # a bad figure grants nothing


def test_own_stall_asks_the_nodes_stalls_over_the_silence_just_ended():
    asked: list[tuple[float, float]] = []

    def stalled(t0: float, t1: float) -> float:
        asked.append((t0, t1))
        return 4.0

    assert own_stall(LivenessBounds(), 11.0) == 0.0
    assert own_stall(LivenessBounds(stalled=stalled), 11.0) == 4.0
    (t0, t1), = asked
    assert t1 - t0 == pytest.approx(11.0)


def test_an_idle_runner_is_never_stuck():
    assert stuck_reason(HeartbeatMsg(), age=0.0, **BOUNDS) is None
    assert stuck_reason(HeartbeatMsg(busy="", busy_for=1e6), age=1e6, **BOUNDS) is None


def test_a_30_s_step_after_fast_warmup_steps_is_not_stuck_and_one_past_the_floor_is():
    """The issue's case: the machine is busy, one step takes 30 s though warm-up steps took
    0.05 s; a step wedged in a collective is stuck once past the floor."""
    assert stuck_reason(HeartbeatMsg("step", 30.0, 0.05), age=1.0, **BOUNDS) is None
    reason = stuck_reason(HeartbeatMsg("step", RUNNER_STEP_FLOOR + 0.5, 0.05), age=1.0, **BOUNDS)
    assert reason is not None and "engine step" in reason and f"{RUNNER_STEP_FLOOR:g} s" in reason


def test_the_bound_scales_with_the_measured_step_time():
    """A model whose steps take 20 s each (warm-up included) may take 99 s for one step."""
    assert step_bound(20.0, floor=45, factor=5) == 100
    assert stuck_reason(HeartbeatMsg("step", 99.0, 20.0), age=0.0, **BOUNDS) is None
    assert stuck_reason(HeartbeatMsg("round", 101.0, 20.0), age=0.0, **BOUNDS) is not None


@given(longest=st.floats(0, 1e4), busy_for=st.floats(0, 1e5), age=st.floats(0, 100))
def test_a_step_is_stuck_exactly_when_past_its_bound(longest, busy_for, age):
    reason = stuck_reason(HeartbeatMsg("step", busy_for, longest), age=age, **BOUNDS)
    assert (reason is not None) == (busy_for + age > max(RUNNER_STEP_FLOOR, RUNNER_STEP_FACTOR * longest))


@pytest.mark.parametrize("kind, words", [("load", "no layer loaded"), ("warmup", "no warm-up step"),
                                         ("connect", "connecting"), ("task", "task")])
def test_lifecycle_units_are_stuck_after_the_unit_bound(kind, words):
    assert stuck_reason(HeartbeatMsg(kind, RUNNER_UNIT_BOUND - 1, 0.0), age=0.5, **BOUNDS) is None
    reason = stuck_reason(HeartbeatMsg(kind, RUNNER_UNIT_BOUND + 1, 0.0), age=0.5, **BOUNDS)
    assert reason is not None and words in reason and "no progress" in reason


def test_the_heartbeat_age_counts():
    """A heartbeat received a while ago stands for a unit that has gone on since."""
    beat = HeartbeatMsg("step", RUNNER_STEP_FLOOR - 1, 0.0)
    assert stuck_reason(beat, age=0.0, **BOUNDS) is None
    assert stuck_reason(beat, age=2.0, **BOUNDS) is not None


def test_pulse_reports_the_unit_its_age_and_the_longest_recent_step():
    clock = Clock()
    pulse = Pulse(clock, recent=3)
    assert pulse.beat() == HeartbeatMsg("", 0.0, 0.0)
    pulse.record(0.4, warmup=True)
    for seconds in (1.0, 0.2, 0.1, 0.3):  # the 1.0 s step falls out of a window of 3
        with pulse.unit("step"):
            clock.t += seconds
    assert pulse.beat() == HeartbeatMsg("", 0.0, 0.4)  # warm-up's step never falls out
    pulse.begin("load")
    clock.t += 7.0
    assert pulse.beat().busy == "load" and pulse.beat().busy_for == 7.0
    pulse.progress()  # a layer loaded
    clock.t += 1.0
    assert pulse.beat().busy_for == 1.0
    pulse.end()
    assert pulse.beat().busy == ""


def test_a_step_that_raises_still_ends_its_unit():
    clock = Clock()
    pulse = Pulse(clock)
    with pytest.raises(RuntimeError):
        with pulse.unit("step"):
            clock.t += 2.0
            raise RuntimeError("boom")
    assert pulse.beat() == HeartbeatMsg("", 0.0, 2.0)


def test_heartbeat_loop_beats_every_interval_and_stops_when_the_pipe_is_gone():
    clock = Clock()
    pulse = Pulse(clock)
    pulse.begin("step")
    sent, sleeps = [], []

    def send(msg):
        if len(sent) == 3:
            raise BrokenPipeError("node gone")
        sent.append(to_supervisor_decoder.decode(frame(msg)[4:]))

    def sleep(seconds):
        sleeps.append(seconds)
        clock.t += seconds

    heartbeat_loop(pulse, send, 1.0, sleep=sleep)  # returns: the fourth send failed
    assert [b.busy_for for b in sent] == [1.0, 2.0, 3.0] and sleeps == [1.0] * 4
    assert all(b.busy == "step" for b in sent)


def test_slow_step_fault_slows_only_the_first_serving_step():
    faults = RunnerFaults.from_hooks({"slow_step": "30"})
    slept = []
    faults.before_step(slept.append)
    faults.before_step(slept.append)
    assert slept == [30.0]
    with pytest.raises(ValueError):
        RunnerFaults.from_hooks({"slow_step": "long"})


# --- the supervisor's verdict (worker.liveness.liveness_fault) and its frames (FrameReader) ---------
def test_the_verdict_is_silent_before_stuck_and_none_for_a_runner_that_lives():
    bounds = LivenessBounds()
    assert liveness_fault("running", 9.0, None, 0.0, bounds) is None
    assert liveness_fault("running", 11.0, None, 0.0, bounds).kind == "silent"  # type: ignore[union-attr]
    assert liveness_fault("loading", 59.0, None, 0.0, bounds) is None  # the loading bound, 60 s
    long_step = HeartbeatMsg(busy="step", busy_for=RUNNER_STEP_FLOOR + 1, longest_step=0.1)
    fault = liveness_fault("running", 0.5, long_step, 0.5, bounds)
    assert fault is not None and fault.kind == "stuck" and "engine step" in fault.reason and fault.reason.endswith("killed")
    assert liveness_fault("running", 0.5, HeartbeatMsg(busy="step", busy_for=1.0, longest_step=0.1), 0.5, bounds) is None


@given(sizes=st.lists(st.integers(0, 300), max_size=8), cuts=st.lists(st.integers(1, 64), min_size=1, max_size=40))
def test_frames_fed_in_pieces_of_any_size_come_out_whole_and_in_order(sizes, cuts):
    messages = [HeartbeatMsg(busy="x" * n) for n in sizes]
    data = b"".join(frame(m) for m in messages)
    reader, payloads, at, k = FrameReader(), [], 0, 0
    while at < len(data):
        step = cuts[k % len(cuts)]
        payloads += reader.feed(data[at : at + step])
        at, k = at + step, k + 1
    assert [to_supervisor_decoder.decode(p) for p in payloads] == messages


def test_an_oversized_frame_is_refused_from_its_length_alone():
    reader = FrameReader()
    with pytest.raises(FrameTooLarge) as info:
        reader.feed((MAX_FRAME + 1).to_bytes(4, "little") + b"\0" * 10)
    assert info.value.length == MAX_FRAME + 1
