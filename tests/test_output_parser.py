"""The runner's output parser (worker/engine/answer/parser.py): reasoning and tool calls out
of recorded outputs, whatever the token boundaries; calls that do not parse come back as text
with a warning; nothing of a call leaks into the content."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from mlx_lm.tool_parsers import json_tools

from worker.engine.answer.parser import Markers, OutputParser, ParsedCall, Piece, calls_of

QWEN = Markers("<think>", "</think>", "<tool_call>", "</tool_call>")

RECORDED = (
    "<think>\nThe user wants the weather in Paris. I should call get_weather.\n</think>\n\n"
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>\n"
    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}\n</tool_call>"
)


def run(text_pieces: list[str], markers: Markers = QWEN, thinking: bool = False) -> list[Piece]:
    parser = OutputParser(markers, thinking=thinking, parse=json_tools.parse_tool_call)
    out: list[Piece] = []
    for piece in text_pieces:
        out += parser.feed(piece)
    return out + parser.finish()


def merged(pieces: list[Piece]) -> list[tuple[str, object]]:
    """Adjacent texts of one channel joined (token boundaries do not matter)."""
    out: list[tuple[str, object]] = []
    for p in pieces:
        if p.call is not None:
            out.append(("call", p.call))
        elif out and out[-1][0] == p.channel and p.warning is None:
            out[-1] = (p.channel, str(out[-1][1]) + p.text)
        else:
            out.append((p.channel, p.text))
    return out


def test_a_recorded_qwen_turn_splits_into_reasoning_and_calls() -> None:
    got = merged(run([RECORDED]))
    assert got == [
        ("reasoning", "\nThe user wants the weather in Paris. I should call get_weather.\n"),
        ("content", "\n\n"),
        ("call", ParsedCall("get_weather", json.dumps({"city": "Paris", "unit": "c"}))),
        ("content", "\n"),
        ("call", ParsedCall("get_time", json.dumps({"tz": "Europe/Paris"}))),
    ]


@given(st.lists(st.integers(1, len(RECORDED) - 1), unique=True).map(sorted))
def test_any_token_boundaries_give_the_same_events(cuts: list[int]) -> None:
    bounds = [0, *cuts, len(RECORDED)]
    pieces = [RECORDED[a:b] for a, b in zip(bounds, bounds[1:])]
    assert merged(run(pieces)) == merged(run([RECORDED]))


def test_a_prompt_that_ends_inside_a_think_block_starts_in_reasoning() -> None:
    assert merged(run(["plan it</think>Answer: 4"], thinking=True)) == [("reasoning", "plan it"), ("content", "Answer: 4")]


def test_a_call_that_does_not_parse_is_text_with_a_warning() -> None:
    pieces = run(["Sure. <tool_call>{not json}</tool_call> done"])
    bad = [p for p in pieces if p.warning]
    assert len(bad) == 1 and bad[0].text == "<tool_call>{not json}</tool_call>" and "did not parse" in bad[0].warning
    assert "".join(p.text for p in pieces) == "Sure. <tool_call>{not json}</tool_call> done"
    assert not any(p.call for p in pieces)


def test_an_unfinished_call_comes_back_as_text() -> None:
    pieces = run(['<tool_call>{"name": "f", "argu'])
    assert [(p.text, bool(p.warning)) for p in pieces] == [('<tool_call>{"name": "f", "argu', True)]


def test_a_model_without_markers_is_all_content() -> None:
    assert merged(run(["<think>x</think><tool_call>y</tool_call>"], markers=Markers())) == [
        ("content", "<think>x</think><tool_call>y</tool_call>")]


def test_held_text_is_only_a_possible_marker_start() -> None:
    parser = OutputParser(QWEN, parse=json_tools.parse_tool_call)
    assert parser.feed("a <") == [Piece("content", "a ")]
    assert parser.feed("b") == [Piece("content", "<b")]


def test_calls_of_accepts_the_family_shapes_and_refuses_others() -> None:
    assert calls_of({"name": "f", "arguments": '{"a": 1}'}) == [ParsedCall("f", '{"a": 1}')]
    assert calls_of([{"name": "f", "arguments": {}}, {"name": "g", "parameters": {"b": 2}}]) == [
        ParsedCall("f", "{}"), ParsedCall("g", '{"b": 2}')]
    for bad in ({"arguments": {}}, {"name": "f", "arguments": [1]}, "text"):
        try:
            calls_of(bad)
        except ValueError:
            continue
        raise AssertionError(bad)
