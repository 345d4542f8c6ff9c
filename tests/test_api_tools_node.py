"""Tool calling and reasoning through real node processes and the official clients, on the
agent synthetic model (tests/support/tools_node.py). Its random weights say nothing useful, so the
answers are forced: ``tool_choice`` required or named (the runner's grammar), a logit bias on
the end-of-turn token (+100: one call then the end, as the grammar allows the end only after
a complete call; -100: call after call — parallel calls) and on the think-end token (a
reasoning that ends). Thinking is turned off where a test wants no think block."""

from __future__ import annotations

import json

import pytest

from tests.support.tools_node import AGENT_MODEL, OPENAI_TOOLS, agent_node, check_call, no_eos

pytestmark = pytest.mark.integration
openai = pytest.importorskip("openai")

QUESTION = [{"role": "user", "content": "weather in Paris?"}]
NO_THINKING = {"enable_thinking": False}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    node, ids = agent_node(tmp_path_factory)
    try:
        yield node, ids
    finally:
        node.stop()


def client(node):  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=120)


def streamed(oc, **kw):  # type: ignore[no-untyped-def]
    """A streamed chat answer assembled from its deltas: (content, reasoning, calls, finish)."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in oc.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
        for part in delta.tool_calls or []:
            call = calls.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = part.id or call["id"]
            call["name"] += (part.function.name or "") if part.function else ""
            call["arguments"] += (part.function.arguments or "") if part.function else ""
        finish = chunk.choices[0].finish_reason or finish
    return content, reasoning, [calls[i] for i in sorted(calls)], finish


def test_openai_chat_forced_calls_come_back_structured(served) -> None:
    node, ids = served
    oc = client(node)
    one_call = {"model": AGENT_MODEL, "messages": QUESTION, "tools": OPENAI_TOOLS, "temperature": 0, "max_tokens": 100,
                "extra_body": NO_THINKING, "logit_bias": {str(ids["<|im_end|>"]): 100}}
    for choice, names in (("required", {"get_weather", "get_time"}), ({"type": "function", "function": {"name": "get_weather"}}, {"get_weather"})):
        answer = oc.chat.completions.create(tool_choice=choice, **one_call).choices[0]
        assert answer.finish_reason == "tool_calls" and answer.message.content is None, answer
        (call,) = answer.message.tool_calls
        assert call.function.name in names and call.id.startswith("call_") and call.type == "function"
        check_call(call.function.name, call.function.arguments)
        content, _, calls, finish = streamed(oc, tool_choice=choice, **one_call)
        assert (content, finish) == ("", "tool_calls")
        assert [(c["name"], c["arguments"]) for c in calls] == [(call.function.name, call.function.arguments)]


def test_openai_chat_parallel_calls_and_choice_none(served) -> None:
    node, ids = served
    oc = client(node)
    many = oc.chat.completions.create(model=AGENT_MODEL, messages=QUESTION, tools=OPENAI_TOOLS, tool_choice="required", temperature=0,
                                      max_tokens=100, extra_body=NO_THINKING, logit_bias=no_eos(ids)).choices[0]
    assert len(many.message.tool_calls) >= 2, many
    # the call max_tokens cut comes back as text (the runner logs a warning), never dropped
    assert many.finish_reason == "length" and many.message.content.startswith("<tool_call>"), many
    assert len({c.id for c in many.message.tool_calls}) == len(many.message.tool_calls)
    for call in many.message.tool_calls:
        check_call(call.function.name, call.function.arguments)
    none = oc.chat.completions.create(model=AGENT_MODEL, messages=QUESTION, tools=OPENAI_TOOLS, tool_choice="none", temperature=0,
                                      max_tokens=20, extra_body=NO_THINKING).choices[0]
    assert not none.message.tool_calls and none.finish_reason in ("stop", "length") and none.message.content


def test_openai_chat_tool_result_gives_the_final_answer(served) -> None:
    node, ids = served
    oc = client(node)
    forced = oc.chat.completions.create(model=AGENT_MODEL, messages=QUESTION, tools=OPENAI_TOOLS, tool_choice="required", temperature=0,
                                        max_tokens=100, extra_body=NO_THINKING, logit_bias={str(ids["<|im_end|>"]): 100})
    message = forced.choices[0].message
    turn = [*QUESTION, message.model_dump(exclude_none=True)]
    turn += [{"role": "tool", "tool_call_id": c.id, "content": json.dumps({"temperature": 21})} for c in message.tool_calls]
    final = oc.chat.completions.create(model=AGENT_MODEL, messages=turn, tools=OPENAI_TOOLS, tool_choice="auto", temperature=0,
                                       max_tokens=20, extra_body=NO_THINKING)
    answer = final.choices[0]
    assert answer.finish_reason in ("stop", "length") and not answer.message.tool_calls
    assert final.usage.prompt_tokens > forced.usage.prompt_tokens
    content, _, calls, finish = streamed(oc, model=AGENT_MODEL, messages=turn, tools=OPENAI_TOOLS, tool_choice="auto", temperature=0,
                                         max_tokens=20, extra_body=NO_THINKING)
    assert (content, calls, finish) == (answer.message.content or "", [], answer.finish_reason)


def test_openai_chat_reasoning_in_its_own_field(served) -> None:
    """Thinking on: the prompt ends inside a think block, so the answer starts as reasoning;
    with the think end favoured it ends, and a forced call follows."""
    node, ids = served
    oc = client(node)
    ask = {"model": AGENT_MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": 10, "extra_body": {"enable_thinking": True}}
    message = oc.chat.completions.create(**ask).choices[0].message
    reasoning = message.reasoning_content
    assert reasoning and message.reasoning == reasoning and not message.content
    content, streamed_reasoning, _, _ = streamed(oc, **ask)
    assert (content, streamed_reasoning) == ("", reasoning)
    answer = oc.chat.completions.create(model=AGENT_MODEL, messages=QUESTION, tools=OPENAI_TOOLS, tool_choice="required", temperature=0,
                                        max_tokens=100, logit_bias={str(ids["</think>"]): 2}).choices[0]
    assert answer.message.reasoning_content and answer.message.tool_calls, answer
    assert "</think>" not in (answer.message.content or "") and "<think>" not in (answer.message.content or "")
    for call in answer.message.tool_calls:
        check_call(call.function.name, call.function.arguments)


ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"], "input_schema": t["function"]["parameters"]}
                   for t in OPENAI_TOOLS]
THINKING_OFF = {"type": "disabled"}


def anthropic_client(node):  # type: ignore[no-untyped-def]
    anthropic = pytest.importorskip("anthropic")
    return anthropic.Anthropic(base_url=node.url, api_key="unused", max_retries=0, timeout=120)


def test_anthropic_forced_tool_use_and_the_result_turn(served) -> None:
    node, _ = served
    ac = anthropic_client(node)
    ask = {"model": AGENT_MODEL, "max_tokens": 100, "messages": QUESTION, "tools": ANTHROPIC_TOOLS, "thinking": THINKING_OFF,
           "extra_body": {"temperature": 0}}
    for choice, names in (({"type": "any"}, {"get_weather", "get_time"}), ({"type": "tool", "name": "get_weather"}, {"get_weather"})):
        message = ac.messages.create(tool_choice=choice, **ask)
        with ac.messages.stream(tool_choice=choice, **ask) as stream:
            final = stream.get_final_message()
        uses = [b for b in message.content if b.type == "tool_use"]
        assert uses and message.stop_reason in ("tool_use", "max_tokens"), message
        assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [(b.name, b.input) for b in uses]
        for block in uses:
            assert block.name in names
            check_call(block.name, block.input)
    one = ac.messages.create(tool_choice={"type": "any", "disable_parallel_tool_use": True}, **ask)
    assert len([b for b in one.content if b.type == "tool_use"]) == 1
    turn = [*QUESTION, {"role": "assistant", "content": [b.model_dump(include={"type", "id", "name", "input"}) for b in uses]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": "21 degrees"} for b in uses]}]
    answer = ac.messages.create(**{**ask, "messages": turn, "max_tokens": 20})
    assert answer.stop_reason in ("end_turn", "max_tokens") and not [b for b in answer.content if b.type == "tool_use"]
    prompt = [u.input_tokens + u.cache_read_input_tokens for u in (message.usage, answer.usage)]  # cache reads counted apart
    assert prompt[1] > prompt[0]
    none = ac.messages.create(tool_choice={"type": "none"}, **{**ask, "max_tokens": 20})
    assert not [b for b in none.content if b.type == "tool_use"]


def test_anthropic_thinking_blocks_only_when_enabled(served) -> None:
    node, _ = served
    ac = anthropic_client(node)
    ask = {"model": AGENT_MODEL, "max_tokens": 10, "messages": QUESTION, "extra_body": {"temperature": 0}}
    enabled = {"type": "enabled", "budget_tokens": 1024}
    message = ac.messages.create(thinking=enabled, **ask)
    thoughts = [b.thinking for b in message.content if b.type == "thinking"]
    assert len(thoughts) == 1 and thoughts[0]
    with ac.messages.stream(thinking=enabled, **ask) as stream:
        final = stream.get_final_message()
    assert [b.thinking for b in final.content if b.type == "thinking"] == thoughts
    plain = ac.messages.create(**ask)  # the template thinks by default; the blocks are not asked for
    assert [b.type for b in plain.content] == ["text"] and thoughts[0] not in plain.content[0].text


RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in OPENAI_TOOLS]


def test_responses_function_calls_outputs_and_reasoning_items(served) -> None:
    node, _ = served
    oc = client(node)
    ask = {"model": AGENT_MODEL, "input": "weather in Paris?", "tools": RESPONSES_TOOLS, "reasoning": {"effort": "none"}, "temperature": 0,
           "max_output_tokens": 100}
    for choice, names in (("required", {"get_weather", "get_time"}), ({"type": "function", "name": "get_weather"}, {"get_weather"})):
        response = oc.responses.create(tool_choice=choice, **ask)
        calls = [o for o in response.output if o.type == "function_call"]
        events = list(oc.responses.create(tool_choice=choice, stream=True, **ask))
        final = events[-1].response
        assert calls and [(c.name, c.arguments) for c in calls] == [(o.name, o.arguments) for o in final.output if o.type == "function_call"]
        assert [e.arguments for e in events if e.type == "response.function_call_arguments.done"] == [c.arguments for c in calls]
        for call in calls:
            assert call.name in names and call.call_id.startswith("call_")
            check_call(call.name, call.arguments)
    turn = [{"role": "user", "content": "weather in Paris?"}, *[c.model_dump(exclude_none=True) for c in calls]]
    turn += [{"type": "function_call_output", "call_id": c.call_id, "output": "21 degrees"} for c in calls]
    answer = oc.responses.create(**{**ask, "input": turn, "max_output_tokens": 20})
    assert answer.status in ("completed", "incomplete") and answer.usage.input_tokens > response.usage.input_tokens
    thinking = oc.responses.create(model=AGENT_MODEL, input="weather in Paris?", reasoning={"effort": "high"}, temperature=0, max_output_tokens=10)
    (reasoning,) = [o for o in thinking.output if o.type == "reasoning"]
    assert reasoning.content[0].text and not thinking.output_text


def test_ollama_tool_calls_results_and_thinking(served) -> None:
    ollama = pytest.importorskip("ollama")
    node, _ = served
    lc = ollama.Client(host=node.url, timeout=120)
    options = {"temperature": 0, "num_predict": 100}
    # Ollama has no tool choice, so nothing forces a call: whatever the random weights answer
    # (text here) is the same streamed; the earlier turn's calls and results render (tests/test_api_tools.py
    # shows the calls' shapes)
    answer = lc.chat(model=AGENT_MODEL, messages=QUESTION, tools=OPENAI_TOOLS, think=False, options=options)
    calls = answer.message.tool_calls or []
    parts = list(lc.chat(model=AGENT_MODEL, messages=QUESTION, tools=OPENAI_TOOLS, think=False, options=options, stream=True))
    streamed_calls = [c for p in parts for c in p.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in streamed_calls] == [(c.function.name, dict(c.function.arguments)) for c in calls]
    turn = [*QUESTION, {"role": "assistant", "content": answer.message.content or "",
                        "tool_calls": [{"function": {"name": c.function.name, "arguments": dict(c.function.arguments)}} for c in calls]}]
    turn += [{"role": "tool", "content": "21 degrees", "tool_name": c.function.name} for c in calls]
    final = lc.chat(model=AGENT_MODEL, messages=turn, tools=OPENAI_TOOLS, think=False, options={"temperature": 0, "num_predict": 20})
    assert final.done_reason in ("stop", "length") and final.prompt_eval_count > answer.prompt_eval_count
    thinking = lc.chat(model=AGENT_MODEL, messages=QUESTION, think=True, options={"temperature": 0, "num_predict": 10})
    assert thinking.message.thinking and not thinking.message.content
    streamed = "".join(p.message.thinking or "" for p in lc.chat(model=AGENT_MODEL, messages=QUESTION, think=True, stream=True,
                                                                  options={"temperature": 0, "num_predict": 10}))
    assert streamed == thinking.message.thinking
    for call in calls:
        check_call(call.function.name, dict(call.function.arguments))
