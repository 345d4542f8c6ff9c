"""Stop-string matching (worker/engine/answer/stop.py): a stop string may span tokens and end anywhere in a delta."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.engine.answer.stop import StopMatcher


def run(stops, deltas: list[str]) -> tuple[list[str], bool, str]:
    m = StopMatcher(stops)
    emitted: list[str] = []
    stopped = False
    for d in deltas:
        e, stopped = m.feed(d)
        emitted.append(e)
        if stopped:
            break
    return emitted, stopped, m.flush()


def expected(text: str, stops: list[str]) -> str:
    """Text before the stop occurrence that completes first (brute force over end indices)."""
    for end in range(len(text) + 1):
        starts = [end - len(s) for s in stops if s and text[:end].endswith(s)]
        if starts:
            return text[: min(starts)]
    return text


def splits(text: str, cuts: list[int]) -> list[str]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in zip(points, points[1:])]


def test_b25_two_stops_spanning_tokens() -> None:
    deltas = ["alpha", " E", "N", "D be", "ta STOP", "HERE", " gamma"]
    emitted, stopped, rest = run(["END", "STOPHERE"], deltas)
    assert stopped and "".join(emitted) == "alpha " and rest == ""
    # The partial prefix "EN" is held back, never emitted and then retracted.
    assert emitted[:3] == ["alpha", " ", ""]


def test_b25_single_stop_as_plain_string() -> None:
    emitted, stopped, _ = run("END", ["alpha E", "ND beta STOPHERE gamma"])
    assert stopped and "".join(emitted) == "alpha "


def test_shorter_stop_not_aligned_with_the_end_is_found() -> None:
    # One delta carries the whole of "END" followed by more text (a stop must not need to end the delta).
    emitted, stopped, _ = run(["STOPHERE", "END"], ["alpha END beta STOPHERE gamma"])
    assert stopped and "".join(emitted) == "alpha "


def test_no_stop_flushes_held_prefix() -> None:
    emitted, stopped, rest = run(["END"], ["alpha E", "N"])
    assert not stopped and "".join(emitted) == "alpha " and rest == "EN"


def test_stop_completing_first_wins_over_one_starting_earlier() -> None:
    # "EDD" starts first but "D" completes first: generation stops at "D", whatever the split.
    for deltas in (["E", "D", "D"], ["EDD"], ["ED", "D"]):
        emitted, stopped, _ = run(["D", "EDD"], deltas)
        assert stopped and "".join(emitted) == "E"


def test_no_stops_passes_through() -> None:
    emitted, stopped, rest = run([], ["a", "b"])
    assert emitted == ["a", "b"] and not stopped and rest == ""


@settings(max_examples=400, deadline=None)
@given(
    text=st.text(alphabet="abEND ", max_size=40),
    stops=st.lists(st.text(alphabet="abEND ", min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=12),
)
def test_any_split_emits_text_up_to_first_stop(text: str, stops: list[str], cuts: list[int]) -> None:
    deltas = splits(text, cuts)
    emitted, stopped, rest = run(stops, deltas)
    want = expected(text, stops)
    assert "".join(emitted) + rest == want
    assert stopped == any(s in text for s in stops)
    so_far = ""
    for e in emitted:
        so_far += e
        assert not any(s in so_far for s in stops), (so_far, stops)
    # Held-back text is bounded by the longest stop.
    assert len(rest) <= max((len(s) for s in stops), default=1) - 1 or not stops
