"""The prefill slots' fairness rule (``worker.engine.fair_share.prefill_choice``) on its own.

Properties of the pick: the slots are never exceeded and never left idle while a candidate could take
them (work-conserving, new rows within the batch's room); every client gets at least
``min(its candidates, slots // clients)`` slots; a client's chosen candidates are its oldest;
the oldest candidate is always chosen, so simulated step by step every prompt finishes
within a bound (every prefilling row progresses); the pick does not depend on the order the
candidates are listed in (ranks that hold the same rows pick alike). Of the prompts picked,
those fed together are alike in length (the shortest always among them), and each one left
out for its length gets a chunk of its own within ``LONG_TURN`` steps per prompt left out.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.engine.fair_share import LENGTH_FACTOR, LENGTH_SLACK, LONG_TURN, Candidate, fed_together, prefill_choice, turn


@st.composite
def candidate_sets(draw: st.DrawFn) -> list[Candidate]:
    n = draw(st.integers(0, 24))
    clients = draw(st.lists(st.sampled_from("abcdef"), min_size=n, max_size=n))
    accepted = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    orders = draw(st.permutations(range(n)))
    return [Candidate(f"t{i}", c, o, a) for i, (c, o, a) in enumerate(zip(clients, orders, accepted))]


slots_st = st.integers(0, 10)
new_rows_st = st.one_of(st.none(), st.integers(0, 12))


@given(candidate_sets(), slots_st, new_rows_st)
def test_budget_never_exceeded_and_slots_never_idle(cands: list[Candidate], slots: int, new_rows: int | None) -> None:
    chosen = prefill_choice(cands, slots, new_rows)
    assert len(chosen) == len(set(chosen)) <= slots
    by_id = {c.task_id: c for c in cands}
    assert set(chosen) <= set(by_id)
    fresh = sum(1 for t in chosen if not by_id[t].accepted)
    assert new_rows is None or fresh <= new_rows
    n_accepted = sum(1 for c in cands if c.accepted)
    n_new = len(cands) - n_accepted
    eligible = n_accepted + (n_new if new_rows is None else min(new_rows, n_new))
    assert len(chosen) == min(slots, eligible)


@given(candidate_sets(), slots_st)
def test_every_client_gets_its_share_and_its_oldest_first(cands: list[Candidate], slots: int) -> None:
    chosen = set(prefill_choice(cands, slots))
    clients = {c.client for c in cands}
    for client in clients:
        mine = sorted((c for c in cands if c.client == client), key=lambda c: c.order)
        got = [c for c in mine if c.task_id in chosen]
        assert len(got) >= min(len(mine), slots // len(clients)), client
        assert got == mine[: len(got)], client  # its oldest candidates


@given(candidate_sets(), st.integers(1, 10), new_rows_st)
def test_the_oldest_candidate_is_always_chosen(cands: list[Candidate], slots: int, new_rows: int | None) -> None:
    chosen = prefill_choice(cands, slots, new_rows)
    eligible = [c for c in cands if c.accepted or new_rows is None or new_rows > 0]
    if eligible:
        assert min(eligible, key=lambda c: c.order).task_id in chosen


@given(candidate_sets(), slots_st, new_rows_st, st.randoms())
def test_the_pick_does_not_depend_on_the_listing_order(cands: list[Candidate], slots: int, new_rows: int | None,
                                                        rnd) -> None:
    shuffled = list(cands)
    rnd.shuffle(shuffled)
    assert prefill_choice(shuffled, slots, new_rows) == prefill_choice(cands, slots, new_rows)


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 40)), min_size=1, max_size=12),
       st.integers(1, 4), st.integers(1, 8))
def test_every_prompt_progresses_to_its_end(prompts: list[tuple[str, int]], slots: int, chunk: int) -> None:
    """Step by step, the chosen prompts each take a chunk: every prompt ends within
    Σ ⌈len / chunk⌉ steps (each step, the oldest unfinished one progresses)."""
    left = {f"t{i}": n for i, (_, n) in enumerate(prompts)}
    cands = {f"t{i}": Candidate(f"t{i}", c, i) for i, (c, _) in enumerate(prompts)}
    bound = sum(-(-n // chunk) for _, n in prompts)
    for _ in range(bound):
        if not left:
            break
        for t in prefill_choice([cands[t] for t in left], slots):
            left[t] -= chunk
            if left[t] <= 0:
                del left[t]
    assert not left


def test_one_clients_ten_prompts_leave_a_slot_for_another() -> None:
    """Client a's ten prompts fill the slots until b's one arrives; then b takes a slot at
    once, a keeps the rest, and a's newest chosen row is the one set aside."""
    a = [Candidate(f"a{i}", "a", i) for i in range(10)]
    assert prefill_choice(a, 4) == ["a0", "a1", "a2", "a3"]
    b = Candidate("b0", "b", 10, accepted=False)
    assert prefill_choice([*a, b], 4, new_rows=6) == ["a0", "b0", "a1", "a2"]
    assert prefill_choice([*a, b], 4, new_rows=0) == ["a0", "a1", "a2", "a3"]  # no batch row for b


@given(st.lists(st.integers(0, 20_000), max_size=10))
def test_prompts_fed_together_are_alike_in_length(lengths: list[int]) -> None:
    """The shortest prompt is always fed; every prompt fed is within the factor of it; none
    left out is; the order is kept."""
    named = [(f"t{i}", n) for i, n in enumerate(lengths)]
    fed = fed_together(named)
    assert fed == [t for t, _ in named if t in set(fed)]
    if named:
        shortest = min(lengths)
        assert any(n == shortest for t, n in named if t in fed)
        for t, n in named:
            assert (t in fed) == (n <= LENGTH_FACTOR * shortest + LENGTH_SLACK)


@given(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=4, unique=True), st.integers(0, 400))
def test_every_prompt_left_out_gets_a_turn(left_out: list[str], start: int) -> None:
    """Within ``LONG_TURN`` × (prompts left out) steps from any step, each of them is fed once;
    no step feeds more than one, and only every ``LONG_TURN``-th step feeds one."""
    fed = [turn(left_out, step) for step in range(start, start + LONG_TURN * len(left_out))]
    assert sorted(t for t in fed if t is not None) == sorted(left_out)
    assert sum(1 for t in fed if t is not None) == len(left_out)
    assert turn([], 7) is None


def test_bad_arguments_are_errors() -> None:
    with pytest.raises(ValueError, match="slots"):
        prefill_choice([], -1)
    with pytest.raises(ValueError, match="twice"):
        prefill_choice([Candidate("t", "a", 0), Candidate("t", "b", 1)], 2)
    with pytest.raises(ValueError, match="negative"):
        fed_together([("t", -1)])
