"""A request waits longer for a re-placement that visibly progresses (pure rules:
exo_p2p/api/generation/replacement_progress.py and ``on_refusal``'s ``progress_age``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from exo_p2p.api.generation.replacement_progress import PROGRESS_BOUND, PROGRESS_FRESH, ProgressAge, progress_mark
from exo_p2p.api.generation.resume import MOVE_BOUND, GiveUp, Retry, on_refusal
from exo_p2p.types import ErrorInfo, Instance, RunnerFailed, RunnerLoading, RunnerReady, State
from exo_p2p.types.state import RunnerRecord
from tests.support.resume_scripts import FAILED, LOADING

MODEL = "m"


def state(*runners: tuple[str, str, object], failed: tuple[str, ...] = ()) -> State:
    """Instances named by ``runners`` (runner id, instance id, status), all of MODEL."""
    instances = {iid: Instance(instance_id=iid, model_id=MODEL, sharding="pipeline", shards=(),  # type: ignore[arg-type]
                               failed_reason="x" if iid in failed else None)
                 for _, iid, _ in runners}
    recs = {rid: RunnerRecord(rid, iid, "n1", status) for rid, iid, status in runners}  # type: ignore[arg-type]
    return State(instances=instances, runners=recs)  # type: ignore[arg-type]


def test_the_mark_counts_layers_of_instances_on_their_way_only():
    s = state(("r0", "new", RunnerLoading(3, 10)), ("r1", "new", RunnerLoading(5, 10)),
              ("x0", "old", RunnerFailed("killed")), ("y0", "live", RunnerReady()), failed=("old",))
    assert progress_mark(s, MODEL) == (("r0", "loading", 3), ("r1", "loading", 5))
    assert progress_mark(s, "other") == ()
    assert progress_mark(state(("y0", "live", RunnerReady())), MODEL) == ()


def test_progress_age_restarts_at_each_change_and_is_none_when_nothing_comes():
    ages = ProgressAge(now=0.0)
    one, two = (("r0", "loading", 1),), (("r0", "loading", 2),)
    assert ages.age(one, 5.0) == 0.0
    assert ages.age(one, 25.0) == 20.0
    assert ages.age(two, 26.0) == 0.0  # a layer loaded
    assert ages.age((), 27.0) is None


def test_a_progressing_replacement_is_waited_for_past_the_move_bound():
    """The issue's case: the re-placement's load took 42 s on busy cores after a 5 s timeout
    and backoff; the request used to end at 60 s with 'could not move within 60 s'."""
    assert isinstance(on_refusal(FAILED, LOADING, waited=70.0, progress_age=3.0), Retry)
    stalled = on_refusal(FAILED, LOADING, waited=70.0, progress_age=PROGRESS_FRESH + 1)
    assert isinstance(stalled, GiveUp) and f"within {MOVE_BOUND:g} s" in stalled.error.message
    capped = on_refusal(FAILED, LOADING, waited=PROGRESS_BOUND, progress_age=1.0)
    assert isinstance(capped, GiveUp) and "still progressing" in capped.error.message
    assert isinstance(on_refusal(FAILED, LOADING, waited=70.0, progress_age=None), GiveUp)


@given(st.floats(0, 400), st.none() | st.floats(0, 100))
def test_a_refusal_waits_within_the_move_bound_or_while_progressing_up_to_its_cap(waited, age):
    step = on_refusal(FAILED, LOADING, waited=waited, progress_age=age)
    progressing = age is not None and age <= PROGRESS_FRESH
    waits = waited + 0.5 <= MOVE_BOUND or (progressing and waited + 0.5 <= PROGRESS_BOUND)
    assert isinstance(step, Retry) == waits


def test_a_refusal_retrying_cannot_fix_is_not_waited_for_however_it_progresses():
    oom = ErrorInfo(503, "out of memory", "server_error", code="out_of_memory")
    assert isinstance(on_refusal(FAILED, oom, waited=1.0, progress_age=0.0), GiveUp)
    assert isinstance(on_refusal(FAILED, LOADING, waited=1.0, progress_age=0.0, given_up=True), GiveUp)
