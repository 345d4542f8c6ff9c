"""Tool calling and reasoning in the engine, in process (worker/engine/answer/tools.py,
output_parser.py): the generic format on a model without tool markers and the native format
of the synthetic agent model (Qwen-like, mlx-lm's json_tools parser); tool_choice required,
named, none and auto; calls never in the content; reasoning apart; a resumed call not
duplicated; renderings of earlier turns byte-stable for the prompt cache."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tests.support.models.synthetic_models import make_synthetic_model
from exo_p2p.types.chunks import ErrorChunk, FinishChunk, TokenChunk
from exo_p2p.types.engine import EngineSettings
from exo_p2p.types.tasks import ChatMessage, GenerationParams, ToolCall
from worker.engine.builder import build_engine
from worker.engine.loading.loader import LoadedModel, load_all
from worker.engine.prepare import prepare, prompt_ids

MAX_STEPS = 2_000
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                             "parameters": {"type": "object",
                                                            "properties": {"city": {"type": "string", "maxLength": 12},
                                                                           "days": {"type": "integer", "minimum": 1,
                                                                                    "maximum": 7}},
                                                            "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"], "additionalProperties": False}}}
TOOLS = json.dumps([WEATHER, TIME])


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_all(make_synthetic_model(tmp_path_factory.mktemp("p") / "plain"))


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_all(make_synthetic_model(tmp_path_factory.mktemp("a") / "agent", agent=True))


def ask(text: str = "weather in Paris?", **kw) -> GenerationParams:
    return GenerationParams(messages=(ChatMessage("user", text),), **{"max_tokens": 150, "temperature": 0.0, **kw})


def serve(loaded: LoadedModel, requests: dict[str, GenerationParams]) -> dict[str, tuple[list[TokenChunk], object]]:
    gen = build_engine(loaded, EngineSettings(max_batch=8))
    for task_id, p in requests.items():
        gen.submit(task_id, p)
    chunks: list = []
    for _ in range(MAX_STEPS):
        if not gen.has_work():
            break
        chunks += gen.step()
    out = {}
    for task_id in requests:
        tokens = [c for c in chunks if isinstance(c, TokenChunk) and c.task_id == task_id]
        ends = [c for c in chunks if isinstance(c, (FinishChunk, ErrorChunk)) and c.task_id == task_id]
        assert len(ends) == 1, ends
        out[task_id] = (tokens, ends[0])
    return out


def calls_of(tokens: list[TokenChunk]) -> list[ToolCall]:
    return [c for t in tokens for c in t.calls]


def check_call(call: ToolCall) -> None:
    tool = {"get_weather": WEATHER, "get_time": TIME}[call.name]
    jsonschema.validate(json.loads(call.arguments), tool["function"]["parameters"])


@pytest.mark.parametrize("model", ["plain", "agent"])
def test_required_and_named_choices_force_valid_calls(model: str, request: pytest.FixtureRequest) -> None:
    loaded = request.getfixturevalue(model)
    got = serve(loaded, {"req": ask(tools=TOOLS, tool_choice="required"),
                         "named": ask(tools=TOOLS, tool_choice="function:get_time"),
                         "free": ask("hello", max_tokens=20)})
    for task_id in ("req", "named"):
        tokens, end = got[task_id]
        calls = calls_of(tokens)
        assert isinstance(end, FinishChunk) and calls, (task_id, end, tokens)
        if end.finish_reason == "tool_calls":
            assert "".join(t.text for t in tokens).strip() == ""  # nothing of a call in the content
        for i, call in enumerate(calls):
            check_call(call)
            assert call.id == f"call_{task_id}_{i}"
    assert all(c.name == "get_time" for c in calls_of(got["named"][0]))
    assert not calls_of(got["free"][0])


def test_auto_in_the_generic_format_is_text_or_calls(plain: LoadedModel) -> None:
    tokens, end = serve(plain, {"a": ask(tools=TOOLS, max_tokens=40)})["a"]
    text = "".join(t.text for t in tokens)
    assert calls_of(tokens) or not text.startswith("<"), text
    assert "<tool_call>" not in text


def test_none_renders_no_tools_and_parses_no_calls(plain: LoadedModel) -> None:
    with_tools = prompt_ids("t", ask(tools=TOOLS), plain, "m")
    none = prompt_ids("t", ask(tools=TOOLS, tool_choice="none"), plain, "m")
    assert none == prompt_ids("t", ask(), plain, "m") and len(with_tools) > len(none)  # type: ignore[arg-type]
    seq = prepare("t", ask(tools=TOOLS, tool_choice="none"), plain, model_id="m", submitted_at=0.0)
    assert seq.parser is None and seq.constraint is None  # type: ignore[union-attr]


def test_the_native_template_gets_the_tools(agent: LoadedModel) -> None:
    text = agent.tokenizer.decode(prompt_ids("t", ask(tools=TOOLS), agent, "m"))  # type: ignore[arg-type]
    assert "<tools>" in text and '"get_weather"' in text and "You can call the following tools" not in text


def test_reasoning_is_apart_from_the_content(agent: LoadedModel) -> None:
    """Tokens of "<think>plan</think>Hi" fed to a sequence: the reasoning in its field, the
    markers nowhere, the content alone in the text."""
    seq = prepare("r", ask(max_tokens=50), agent, model_id="m", submitted_at=0.0)
    assert seq.parser is not None  # type: ignore[union-attr]
    chunks: list = []
    for token in agent.tokenizer.encode("<think>plan it</think>Hi there"):
        chunks += seq.consume(token, 1.0)[0]  # type: ignore[union-attr]
    chunks += seq.consume(sorted(agent.eos_token_ids)[0], 2.0)[0]  # type: ignore[union-attr]
    tokens = [c for c in chunks if isinstance(c, TokenChunk)]
    assert "".join(t.reasoning for t in tokens) == "plan it"
    assert "".join(t.text for t in tokens) == "Hi there"


def test_a_resumed_call_is_neither_lost_nor_duplicated(plain: LoadedModel) -> None:
    params = ask(tools=TOOLS, tool_choice="required")
    tokens, _end = serve(plain, {"whole": params})["whole"]
    first = next(i for i, t in enumerate(tokens) if t.calls)
    cut = first - 2  # inside the first call: its end marker not yet sent
    ids = [t.token_id for t in tokens[:cut]]
    assert cut > 2 and None not in ids
    resumed = GenerationParams(**{**{f: getattr(params, f) for f in params.__struct_fields__},
                                  "resume_tokens": tuple(ids), "origin_task_id": "whole"})
    rest, end = serve(plain, {"rest": resumed})["rest"]
    assert calls_of(tokens[:cut]) == [] and calls_of(rest) == calls_of(tokens)


def test_earlier_turns_render_byte_stable(plain: LoadedModel, agent: LoadedModel) -> None:
    """Turn N's prompt is a prefix of turn N+1's (its call and the result appended), so the
    prompt cache serves turn N+1 from turn N's KV."""
    call = ToolCall("call_1", "get_weather", '{"city": "Paris", "days": 2}')
    turn1 = (ChatMessage("system", "Be brief."), ChatMessage("user", "weather?"))
    turn2 = (*turn1, ChatMessage("assistant", "", tool_calls=(call,)), ChatMessage("tool", '{"t": 21}', tool_call_id="call_1"),
             ChatMessage("user", "and tomorrow?"))
    for loaded in (plain, agent):
        one = prompt_ids("t", GenerationParams(messages=turn1, tools=TOOLS), loaded, "m")
        two = prompt_ids("t", GenerationParams(messages=turn2, tools=TOOLS), loaded, "m")
        assert isinstance(one, list) and isinstance(two, list) and two[: len(one)] == one


def test_a_six_turn_tool_session_reuses_its_prompt(plain: LoadedModel) -> None:
    """Each turn (a forced call, its result sent back) reuses ≥ 90% of its prompt from the
    prompt cache: earlier turns render byte-stable and a forced call's text is the template's
    own rendering of it."""
    gen = build_engine(plain, EngineSettings(prompt_cache_bytes=64 << 20))
    messages = [ChatMessage("system", "Be brief."), ChatMessage("user", "Weather in Paris, Rome, Oslo?")]
    reuse = []
    for turn in range(6):
        before = gen.prefilled_tokens
        gen.submit(f"t{turn}", GenerationParams(messages=tuple(messages), tools=TOOLS, tool_choice="required",
                                                max_tokens=60, temperature=0.0))
        chunks: list = []
        for _ in range(MAX_STEPS):
            if not gen.has_work():
                break
            chunks += gen.step()
        end = next(c for c in chunks if isinstance(c, FinishChunk))
        calls = [c for t in chunks if isinstance(t, TokenChunk) for c in t.calls]
        reuse.append(1 - (gen.prefilled_tokens - before) / end.prompt_tokens)
        messages.append(ChatMessage("assistant", "", tool_calls=tuple(calls)))
        messages += [ChatMessage("tool", '{"sky": "clear"}', tool_call_id=c.id) for c in calls]
    assert reuse[0] < 0.05 and min(reuse[1:]) >= 0.9, reuse


def test_auto_tools_with_a_format_answer_in_the_format_or_call(plain: LoadedModel) -> None:
    """tools (auto) and a JSON schema together: the answer is a call or JSON of the schema,
    never free text; a Lark grammar with tools is a 400."""
    from exo_p2p.types.tasks import OutputFormat

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    got = serve(plain, {"f": ask(tools=TOOLS, max_tokens=120, output_format=OutputFormat("json_schema", json.dumps(schema))),
                        "g": ask(tools=TOOLS, output_format=OutputFormat("lark", 'start: "a"'))})
    tokens, end = got["f"]
    text = "".join(t.text for t in tokens)
    assert calls_of(tokens) or json.loads(text) == {"ok": True} or json.loads(text) == {"ok": False}, (text, end)
    assert isinstance(got["g"][1], ErrorChunk) and got["g"][1].error.status == 400


@pytest.mark.parametrize("model", ["plain", "agent"])
def test_one_call_ends_a_forced_answer_after_its_call(model: str, request: pytest.FixtureRequest) -> None:
    """``parallel_tool_calls: false`` with a forced tool: the tiny model, which never chooses to
    stop, makes one call and its turn ends there (``tool_calls``), well before ``max_tokens``;
    without it the forced grammar lets it repeat calls up to the cap."""
    loaded = request.getfixturevalue(model)
    got = serve(loaded, {"one": ask(tools=TOOLS, tool_choice="function:get_time", one_call=True, max_tokens=400),
                         "many": ask(tools=TOOLS, tool_choice="function:get_time", max_tokens=400)})
    tokens, end = got["one"]
    assert isinstance(end, FinishChunk) and end.finish_reason == "tool_calls", end
    assert len(calls_of(tokens)) == 1 and "".join(t.text for t in tokens).strip() == ""
    assert len(calls_of(got["many"][0])) >= 1
