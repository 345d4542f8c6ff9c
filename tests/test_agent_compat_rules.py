"""The pure rules that let the coding agents' requests through unmodified (docs/agents.md):
late system messages, the overflow wording of each family, Anthropic's tool ids and cache
usage, Responses' include values and sealed reasoning, and a model's capabilities."""

from __future__ import annotations

import msgspec
import pytest
from jinja2 import Environment
from jinja2.exceptions import TemplateError

from exo_p2p.api.errors import ApiError, anthropic_error_body, error_body, ollama_error_body, overflow_message
from exo_p2p.api.families.anthropic import messages as anthropic
from exo_p2p.api.families.openai import responses as openai_responses
from exo_p2p.api.families.anthropic.tools import anthropic_usage, tool_use_id
from exo_p2p.api.families.openai.responses_include import join_reasoning, wants_encrypted_reasoning
from exo_p2p.api.families.openai.sealed_reasoning import MAX_REASONING_BYTES, SealError, derive_key, node_key, reasoning_key, seal, unseal
from tests.support.models.synthetic_agent import AGENT_TEMPLATE
from exo_p2p.models.card.capabilities import template_capabilities, template_of
from tests.support.models.synthetic_models import CHATML_TEMPLATE
from exo_p2p.content.system_turns import fold_late_system, late_system_indexes, messages_for_template
from exo_p2p.types import ChatMessage, ErrorInfo, FinishChunk

pytestmark = pytest.mark.unit

ALTERNATING = ("{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
               "{{ raise_exception('Conversation roles must alternate') }}{% endif %}[{{ m.role }}]{{ m.content }}{% endfor %}")


def renderer(template: str):
    def raise_exception(message: str):
        raise TemplateError(message)

    env = Environment()
    env.globals["raise_exception"] = raise_exception
    compiled = env.from_string(template)
    return lambda messages: compiled.render(messages=messages, add_generation_prompt=True)


CONVERSATION = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "fix the bug"},
                {"role": "system", "content": "# Environment\ncwd: /repo"}, {"role": "user", "content": "go on"}]


def test_late_system_kept_where_the_template_shows_it() -> None:
    assert late_system_indexes(CONVERSATION) == [2]
    assert messages_for_template(renderer(CHATML_TEMPLATE), CONVERSATION) == CONVERSATION


def test_late_system_folded_into_the_next_user_turn_when_the_template_raises_or_drops_it() -> None:
    folded = [CONVERSATION[0], CONVERSATION[1], {"role": "user", "content": "# Environment\ncwd: /repo\n\ngo on"}]
    assert messages_for_template(renderer(ALTERNATING), CONVERSATION) == folded
    assert messages_for_template(renderer(AGENT_TEMPLATE), CONVERSATION) == folded  # renders only messages[0]'s system
    # the rendered prompt of turn 1 is a prefix of turn 2's: the prompt cache keeps hitting
    render = renderer(AGENT_TEMPLATE)
    turn2 = CONVERSATION + [{"role": "assistant", "content": "done"}, {"role": "user", "content": "thanks"}]
    text1 = render(messages_for_template(render, CONVERSATION))
    assert render(messages_for_template(render, turn2)).startswith(text1 + "done")


def test_fold_with_no_user_after_goes_back_or_to_the_system_prompt() -> None:
    tail = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}, {"role": "system", "content": "s"}]
    assert fold_late_system(tail) == [{"role": "user", "content": "u\n\ns"}, {"role": "assistant", "content": "a"}]
    only = [{"role": "assistant", "content": "a"}, {"role": "system", "content": "s"}]
    assert fold_late_system(only) == [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]
    lead = [{"role": "system", "content": "p"}, {"role": "assistant", "content": "a"}, {"role": "system", "content": "s"}]
    assert fold_late_system(lead)[0] == {"role": "system", "content": "p\n\ns"}
    assert fold_late_system(CONVERSATION[:2]) == CONVERSATION[:2]


def test_anthropic_system_turns_anywhere_with_cache_control() -> None:
    body = {"model": "m", "max_tokens": 5, "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "hi"},
                         {"role": "system", "content": [{"type": "text", "text": "# Environment", "cache_control": {"type": "ephemeral"}}]},
                         {"role": "user", "content": "go"}]}
    p = anthropic.messages_params(msgspec.convert(body, anthropic.MessagesRequest))
    assert p.messages == (ChatMessage("system", "You are Claude Code."), ChatMessage("user", "hi"),
                          ChatMessage("system", "# Environment"), ChatMessage("user", "go"))
    counted = msgspec.convert({k: v for k, v in body.items() if k != "max_tokens"}, anthropic.CountTokensRequest)
    assert anthropic.anthropic_messages(counted.messages, counted.system) == p.messages


def overflow(**kw) -> ErrorInfo:
    return ErrorInfo(400, "prompt is 9000 tokens but the model's context is 8192 tokens", param="messages",
                     code="context_length_exceeded", prompt_tokens=9000, context_tokens=8192, **kw)


def test_overflow_in_each_vendors_words() -> None:
    a = msgspec.json.decode(anthropic_error_body(overflow()))
    assert a == {"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 9000 tokens > 8192 maximum"}}
    o = msgspec.json.decode(error_body(overflow()))["error"]
    assert o["code"] == "context_length_exceeded" and o["type"] == "invalid_request_error"
    assert o["message"].startswith("This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.")
    assert msgspec.json.decode(ollama_error_body(overflow())) == {"error": "the input length exceeds the context length"}
    other = ErrorInfo(400, "max_tokens must be at least 1", param="max_tokens")
    assert overflow_message("anthropic", other) == other.message
    no_counts = ErrorInfo(400, "too long", code="context_length_exceeded")
    assert overflow_message("openai", no_counts) == "too long"


def test_anthropic_tool_ids_and_cache_usage() -> None:
    assert tool_use_id("call_4f1c-9a_0") == "toolu_4f1c9a_0"
    assert tool_use_id("toolu_01A") == "toolu_01A"
    fin = FinishChunk(task_id="t", finish_reason="stop", prompt_tokens=100, completion_tokens=5, cached_tokens=80)
    assert anthropic_usage(100, fin) == {"input_tokens": 20, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 80,
                                         "output_tokens": 5}
    assert anthropic_usage(7, None)["input_tokens"] == 7


def test_include_values_one_by_one() -> None:
    assert wants_encrypted_reasoning(["reasoning.encrypted_content", "web_search_call.results"]) is True
    assert wants_encrypted_reasoning(None) is False and wants_encrypted_reasoning(["file_search_call.results"]) is False
    assert wants_encrypted_reasoning(["message.output_text.logprobs"]) is False  # honoured: logprobs are computed
    for value, words in (("nope", "unknown value"), (3, "values are strings")):
        with pytest.raises(ApiError) as info:
            wants_encrypted_reasoning([value])
        assert info.value.info.param == "include" and words in info.value.info.message


def test_sealed_reasoning_round_trip_forgery_and_bounds(tmp_path) -> None:
    key = derive_key(b"cluster secret")
    sealed = seal(key, "think: the bug is in parse()")
    assert sealed is not None and "parse" not in sealed and unseal(key, sealed) == "think: the bug is in parse()"
    assert seal(key, "x") != seal(key, "x")  # a fresh nonce each time
    flipped = sealed[:-3] + ("A" if sealed[-3] != "A" else "B") + sealed[-2:]
    for bad in (flipped, "exo1.AAAA", "plain text", unseal.__name__, seal(derive_key(b"other"), "x")):
        with pytest.raises(SealError):
            unseal(key, bad)  # type: ignore[arg-type]
    with pytest.raises(SealError, match="characters"):
        unseal(key, "exo1." + "A" * 200_000)
    assert seal(key, "x" * (MAX_REASONING_BYTES + 1)) is None
    assert node_key(tmp_path) == node_key(tmp_path) == reasoning_key(None, tmp_path)
    assert (tmp_path / "reasoning.key").stat().st_mode & 0o777 == 0o600
    assert reasoning_key(b"s", tmp_path) == derive_key(b"s") != node_key(tmp_path)


def test_encrypted_reasoning_input_renders_with_the_next_assistant_turn() -> None:
    key = derive_key(b"k")
    body = {"model": "m", "store": False, "include": ["reasoning.encrypted_content"], "input": [
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": seal(key, "plan")},
        {"type": "function_call", "call_id": "call_1", "name": "ls", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "a.py"},
        {"role": "user", "content": "next"}]}
    p = openai_responses.responses_params(msgspec.convert(body, openai_responses.ResponsesRequest), key)
    assert [(m.role, m.reasoning) for m in p.messages] == [("user", None), ("assistant", "plan"), ("tool", None), ("user", None)]
    forged = {**body, "input": [*body["input"][:1], {"type": "reasoning", "encrypted_content": seal(derive_key(b"x"), "evil")}]}
    with pytest.raises(ApiError) as info:
        openai_responses.responses_params(msgspec.convert(forged, openai_responses.ResponsesRequest), key)
    assert info.value.info.param == "input[1].encrypted_content"
    lone = [ChatMessage("user", "u"), ChatMessage("assistant", "", reasoning="r"), ChatMessage("assistant", "", reasoning="s"),
            ChatMessage("user", "v")]
    assert join_reasoning(lone) == [ChatMessage("user", "u"), ChatMessage("assistant", "", reasoning="rs"), ChatMessage("user", "v")]


def test_capabilities_from_the_template() -> None:
    assert template_capabilities(None) == ("completion",)
    assert template_capabilities(CHATML_TEMPLATE) == ("completion",)
    assert template_capabilities(AGENT_TEMPLATE) == ("completion", "tools", "thinking")
    assert template_of(None, b'{"chat_template": [{"name": "default", "template": "{{ tools }}"}]}') == "{{ tools }}"
    assert template_of(b"J", b'{"chat_template": "C"}') == "J" and template_of(None, b"not json") is None
