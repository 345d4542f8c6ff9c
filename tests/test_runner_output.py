"""worker.runner_output: a runner's fd 1/2 output becomes JSON lines of the node's log
(with --log-format json every line is one JSON object, C-level writes of
MLX's ring backend included)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from worker.runner_output import MAX_LINE_CHARS, OutputRelay, ring_failure

FIELDS = {"runner_id": "r0", "pid": 42, "node": "alpha"}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def relay(limit: int = 1000) -> tuple[OutputRelay, list[str], Clock]:
    out: list[str] = []
    clock = Clock()
    return OutputRelay(out.append, FIELDS, max_lines_per_second=limit, clock=clock), out, clock


def test_plain_lines_are_wrapped_and_json_lines_pass_unchanged() -> None:
    r, out, _ = relay()
    already = json.dumps({"event": "runner output", "line": "hello", "node": "alpha"})
    r.feed(b"[ring] Socket 3 was closed by the peer\n" + already.encode() + b"\n\n  \n")
    r.close()
    records = [json.loads(line) for line in out]
    assert records[0]["event"] == "runner output" and records[0]["line"] == "[ring] Socket 3 was closed by the peer"
    assert records[0]["stream"] == "fd" and {k: records[0][k] for k in FIELDS} == FIELDS
    assert out[1] == already + "\n"  # passed through as it was
    assert len(out) == 2  # blank lines dropped


def test_a_line_split_across_reads_is_one_record_and_a_last_line_without_newline_is_kept() -> None:
    r, out, _ = relay()
    for piece in (b"[ri", b"ng] half", b" and half\nlast words"):
        r.feed(piece)
    assert [json.loads(x)["line"] for x in out] == ["[ring] half and half"]
    r.close()
    assert json.loads(out[-1])["line"] == "last words"


def test_long_lines_are_cut_and_undecodable_bytes_replaced() -> None:
    r, out, _ = relay()
    r.feed(b"x" * (MAX_LINE_CHARS * 2) + b"\n" + b"\xff\xfe bad\n")
    records = [json.loads(line) for line in out]
    assert len(records[0]["line"]) == MAX_LINE_CHARS
    assert records[1]["line"].endswith(" bad")


def test_a_flood_is_limited_per_second_and_the_rest_counted_once() -> None:
    r, out, clock = relay(limit=5)
    r.feed(b"".join(b"spam %d\n" % i for i in range(50)))
    assert len(out) == 5 and r.suppressed == 45
    clock.now += 1.0
    r.feed(b"next second\n")
    records = [json.loads(line) for line in out]
    assert records[5] == {**records[5], "event": "runner output suppressed", "lines": 45}
    assert records[6]["line"] == "next second"


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40), max_size=20),
       st.integers(min_value=1, max_value=7))
def test_every_relayed_line_is_one_json_object_whatever_the_splits(lines: list[str], step: int) -> None:
    r, out, _ = relay()
    data = "\n".join(lines).encode()
    for i in range(0, len(data), step):
        r.feed(data[i : i + step])
    r.close()
    for line in out:
        assert line.endswith("\n") and "\n" not in line[:-1]
        assert isinstance(json.loads(line), dict)
    # every non-blank line came through (no rate limit reached here)
    assert len(out) == sum(1 for x in "\n".join(lines).split("\n") if x.strip())


def test_console_format_passes_lines_unchanged_within_the_same_bounds() -> None:
    out: list[str] = []
    clock = Clock()
    r = OutputRelay(out.append, FIELDS, max_lines_per_second=2, clock=clock, raw=True)
    r.feed(b"[ring] one\n[ring] two\n[ring] three\n")
    clock.now += 1
    r.feed(b"after\n")
    assert out == ["[ring] one\n", "[ring] two\n", "runner output suppressed: 1 lines\n", "after\n"]


def test_every_line_is_watched_even_when_suppressed_and_a_ring_giving_up_is_recognised() -> None:
    """MLX's ring prints this after 10 send/recv errors on a socket: that socket's thread is
    gone, so the supervisor fails the runner at once (worker/supervisor.py) instead of
    waiting for a collective that never ends to count as stuck."""
    seen: list[str] = []
    r = OutputRelay(lambda _: None, FIELDS, max_lines_per_second=1, clock=Clock(), on_line=seen.append)
    lines = ["[ring] Socket 5 was closed by the peer"] * 10 + ["[ring] Too many send/recv errors. Failing pending tasks..."]
    r.feed("\n".join(lines).encode() + b"\n")
    assert seen == lines  # 10 of them were suppressed from the log, none from the watcher
    assert [ring_failure(line) for line in seen].count(None) == 10
    assert ring_failure(seen[-1]) == "[ring] Too many send/recv errors. Failing pending tasks..."
    assert ring_failure("[ring] Too many send/recv errors. Aborting...") is not None
    assert ring_failure("warning: something else") is None
