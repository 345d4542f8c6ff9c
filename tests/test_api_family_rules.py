"""The pure request → ``GenerationParams`` rules of each API family (exo_p2p/api/families):
what maps where, and what is refused by name."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p.api.errors import ApiError
from exo_p2p.api.families.anthropic import messages as anthropic
from exo_p2p.api.families.ollama import generations as ollama
from exo_p2p.api.families.openai import chat as openai_chat
from exo_p2p.api.families.openai import completions as openai_completions
from exo_p2p.api.families.openai import responses as openai_responses
from exo_p2p.types import ChatMessage


def refused(fn, *args) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn(*args)
    assert info.value.info.status == 400
    return info.value


def msg_request(**fields):
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], **fields}
    return msgspec.convert(body, anthropic.MessagesRequest)


def test_anthropic_mapping_and_refusals() -> None:
    p = anthropic.messages_params(msg_request(
        system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}, {"role": "assistant", "content": "yes"}],
        stop_sequences=["a", "", "a", "b"], top_k=3, thinking={"type": "disabled"}, tool_choice={"type": "auto"}))
    assert p.messages == (ChatMessage("system", "Be brief."), ChatMessage("user", "hi"), ChatMessage("assistant", "yes"))
    assert (p.max_tokens, p.stop, p.top_k, p.temperature) == (5, ("a", "b"), 3, 0.7)
    for fields, param in [
        ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format.schema"),
        ({"tools": [{"description": "f"}]}, "tools.0.name"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}], "tool_choice": {"type": "tool", "name": "web_search"}},
         "tool_choice"),
        ({"thinking": {"type": "sometimes"}}, "thinking.type"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages.0.content[0].source.type"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "system", "content": [{"type": "image", "source": {}}]}]}, "messages.0.content[0].type"),
        ({"messages": []}, "messages"),
    ]:
        assert refused(anthropic.messages_params, msg_request(**fields)).info.param == param
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"model": "m", "messages": []}, anthropic.MessagesRequest)  # max_tokens is required
    with pytest.raises(msgspec.ValidationError):
        msg_request(temperature=1.5)  # Anthropic's range is 0..1


def test_ollama_options() -> None:
    f = ollama.options_fields({"temperature": 0.2, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "num_predict": 7, "stop": "x",
                               "seed": -1, "repeat_penalty": 1.1, "repeat_last_n": 32, "num_ctx": 4096, "num_thread": 2})
    assert f == {"temperature": 0.2, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "max_tokens": 7, "stop": ("x",),
                 "seed": (1 << 63) - 1, "repetition_penalty": 1.1, "penalty_context": 32}
    assert "max_tokens" not in ollama.options_fields({"num_predict": -1})
    assert "max_tokens" not in ollama.options_fields({"num_predict": -2})
    assert ollama.options_fields({"repeat_penalty": 1.3, "repeat_last_n": 0})["repetition_penalty"] == 1.0
    assert ollama.options_fields({"mirostat": 0, "tfs_z": 1.0, "typical_p": 1}) == {}
    for options, param in [({"mirostat": 1}, "options.mirostat"), ({"typical_p": 0.5}, "options.typical_p"),
                           ({"tfs_z": 0.9}, "options.tfs_z"), ({"temperature": "hot"}, "options.temperature"),
                           ({"top_k": 1.5}, "options.top_k"), ({"num_predict": 0}, "options.num_predict"),
                           ({"stop": [1]}, "options.stop"), ({"top_p": 0}, "options.top_p")]:
        assert refused(ollama.options_fields, options).info.param == param


def test_ollama_chat_and_generate_requests() -> None:
    chat = msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, ollama.ChatRequest)
    assert refused(ollama.chat_params, chat).info.param == "messages[0].images[0]"  # "hi" is no image
    assert ollama.chat_params(msgspec.convert({"model": "m"}, ollama.ChatRequest)) is None  # a load request
    tools = msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{}]}, ollama.ChatRequest)
    assert refused(ollama.chat_params, tools).info.param == "tools[0].type"
    fmt = msgspec.convert({"model": "m", "prompt": "hi", "format": "yaml"}, ollama.GenerateRequest)
    assert refused(ollama.generate_params, fmt).info.param == "format"
    ctx = msgspec.convert({"model": "m", "prompt": "hi", "context": [1, 2]}, ollama.GenerateRequest)
    assert refused(ollama.generate_params, ctx).info.param == "context"
    assert ollama.generate_params(msgspec.convert({"model": "m"}, ollama.GenerateRequest)) is None


def test_responses_input_forms_and_refusals() -> None:
    def req(**fields):
        return msgspec.convert({"model": "m", "input": "hi", **fields}, openai_responses.ResponsesRequest)

    p = openai_responses.responses_params(req(input=[
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
    ], store=False, reasoning={"effort": None}))
    assert p.messages == (ChatMessage("system", "Be brief."), ChatMessage("user", "hi"), ChatMessage("assistant", "hello"))
    for fields, param in [
        ({"store": True}, "store"), ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "c"}, "conversation"), ({"tools": [{"type": "function"}]}, "tools[0].name"),
        ({"text": {"format": {"type": "json_schema"}}}, "text.format.schema"), ({"tools": [{"type": "web_search"}], "tool_choice": "required"}, "tool_choice"),
        ({"include": ["message.output_text.logprobs"], "top_logprobs": 21}, "top_logprobs"), ({"include": ["reasoning.bogus"]}, "include"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"input": [{"type": "function_call_output"}]}, "input[0].call_id"), ({"input": [{"type": "image_generation_call"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0].image_url"),
        ({"input": [], "instructions": "x"}, "input"),
    ]:
        assert refused(openai_responses.responses_params, req(**fields)).info.param == param


def test_completions_prompt_forms_and_refusals() -> None:
    def req(**fields):
        return msgspec.convert({"model": "m", "prompt": "hi", **fields}, openai_completions.CompletionRequest)

    assert openai_completions.completion_params(req(prompt=["once"])).prompt == "once"
    for fields, param in [({"prompt": ["a", "b"]}, "prompt"), ({"prompt": ""}, "prompt"), ({"echo": True}, "echo"),
                          ({"suffix": "x"}, "suffix"), ({"best_of": 2}, "best_of"), ({"n": 2}, "n"), ({"logprobs": 21}, "logprobs"),
                          ({"logprobs": -1}, "logprobs")]:
        assert refused(openai_completions.completion_params, req(**fields)).info.param == param


def _strings(doc):
    """Every string value in a decoded JSON document."""
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for v in doc.values():
            yield from _strings(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from _strings(v)


_LINE_BREAKERS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list(_LINE_BREAKERS) + list("aé中😀\"\\")), max_size=24))
def test_stream_lines_stay_whole_for_any_line_splitter(delta: str) -> None:
    """Every family's stream event is whole lines even for a client that splits with
    ``str.splitlines`` (which also breaks on U+0085, U+2028, U+2029 that JSON may carry raw):
    each line is a field (``data:``/``event:``) or an NDJSON document, and decoding it gives
    back the delta exactly."""
    request = msgspec.convert({"model": "m", "input": "hi"}, openai_responses.ResponsesRequest)
    encoders = [
        openai_chat.ChatEncoder("chatcmpl-1", 0, "m"),
        openai_completions.CompletionEncoder("cmpl-1", 0, "m"),
        openai_responses.ResponsesEncoder("t-1", "m", request),
        anthropic.MessagesEncoder("t-1", "m"),
    ]
    for enc in encoders:
        enc.start(1)
        lines = enc.text(delta).decode().splitlines()
        assert lines[-1] == "" or lines[-1].startswith("data: "), lines
        data = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
        assert all(line == "" or line.startswith(("data: ", "event: ")) for line in lines), (type(enc).__name__, lines)
        assert len(data) == 1 and delta in set(_strings(data[0])), (type(enc).__name__, data)
    ndjson = ollama.OllamaEncoder("m", "chat").text(delta).decode()
    (line,) = ndjson.splitlines()
    assert json.loads(line)["message"]["content"] == delta
