"""Logprobs and thinking budgets as each API family takes and writes them (no processes)."""

from __future__ import annotations

import json

import msgspec
import pytest

from exo_p2p.api.errors import ApiError
from exo_p2p.api.families.anthropic import messages as anthropic
from exo_p2p.api.families.logprob_shapes import legacy, requested
from exo_p2p.api.families.ollama import generations as ollama
from exo_p2p.api.families.openai import chat as openai_chat
from exo_p2p.api.families.openai import completions as openai_completions
from exo_p2p.api.families.openai import responses as openai_responses
from exo_p2p.api.families.think_budgets import EFFORT_BUDGETS
from exo_p2p.api.generation.turn import Turn, answer_bytes, token_bytes
from exo_p2p.types.chunks import FinishChunk, TokenChunk, TokenLogprob, TokenLogprobs

pytestmark = pytest.mark.unit

USER = [{"role": "user", "content": "hi"}]
LP = TokenLogprobs(TokenLogprob(5, "hé", -0.25), (TokenLogprob(5, "hé", -0.25), TokenLogprob(9, " x", -1.5)))
END = FinishChunk(task_id="t", finish_reason="stop", prompt_tokens=3, completion_tokens=2)


def _chunks(*texts: str) -> list[TokenChunk]:
    return [TokenChunk(task_id="t", text=t, completion_tokens=i + 1, token_id=5, logprobs=LP) for i, t in enumerate(texts)]


def test_requests_map_to_the_count_of_alternatives() -> None:
    chat = msgspec.convert({"model": "m", "messages": USER, "logprobs": True, "top_logprobs": 3}, openai_chat.ChatCompletionRequest)
    assert openai_chat.chat_params(chat).logprobs == 3
    assert openai_chat.chat_params(msgspec.convert({"model": "m", "messages": USER, "logprobs": True},
                                                   openai_chat.ChatCompletionRequest)).logprobs == 0
    assert openai_chat.chat_params(msgspec.convert({"model": "m", "messages": USER}, openai_chat.ChatCompletionRequest)).logprobs is None
    done = msgspec.convert({"model": "m", "prompt": "hi", "logprobs": 2}, openai_completions.CompletionRequest)
    assert openai_completions.completion_params(done).logprobs == 2
    oll = msgspec.convert({"model": "m", "messages": USER, "logprobs": True, "top_logprobs": 4}, ollama.ChatRequest)
    assert ollama.chat_params(oll).logprobs == 4
    resp = msgspec.convert({"model": "m", "input": "hi", "include": ["message.output_text.logprobs"], "top_logprobs": 1},
                           openai_responses.ResponsesRequest)
    assert openai_responses.responses_params(resp).logprobs == 1
    for enabled, top in ((True, 21), (True, -1), (False, 2), (True, True)):
        with pytest.raises(ApiError):
            requested(enabled, top)


def test_chat_streams_and_answers_logprobs_in_openai_shape() -> None:
    enc = openai_chat.ChatEncoder(id="c", created=0, model="m", logprobs=True)
    turn = Turn()
    events = [json.loads(line[6:]) for c in _chunks("hé", "") for line in token_bytes(enc, c, turn).decode().splitlines() if line]
    first = events[0]["choices"][0]
    assert first["delta"] == {"content": "hé"} and events[1]["choices"][0]["delta"] == {}
    entry = first["logprobs"]["content"][0]
    assert entry == {"token": "hé", "logprob": -0.25, "bytes": list("hé".encode()),
                     "top_logprobs": [{"token": "hé", "logprob": -0.25, "bytes": [104, 195, 169]},
                                      {"token": " x", "logprob": -1.5, "bytes": [32, 120]}]}
    body = json.loads(answer_bytes(enc, turn, END))
    assert len(body["choices"][0]["logprobs"]["content"]) == 2
    plain = json.loads(answer_bytes(openai_chat.ChatEncoder(id="c", created=0, model="m"), Turn(), END))
    assert plain["choices"][0]["logprobs"] is None


def test_completions_write_the_legacy_object_with_offsets() -> None:
    assert legacy([LP, LP]) == {"tokens": ["hé", "hé"], "token_logprobs": [-0.25, -0.25],
                                "top_logprobs": [{"hé": -0.25, " x": -1.5}] * 2, "text_offset": [0, 2]}
    enc = openai_completions.CompletionEncoder(id="c", created=0, model="m", logprobs=True)
    turn = Turn()
    streamed = [token_bytes(enc, c, turn) for c in _chunks("hé", "hé")]
    assert json.loads(streamed[1].decode()[6:])["choices"][0]["logprobs"]["text_offset"] == [2]
    assert json.loads(answer_bytes(enc, turn, END))["choices"][0]["logprobs"]["text_offset"] == [0, 2]


def test_ollama_and_responses_carry_entries() -> None:
    enc = ollama.OllamaEncoder("m", "chat", logprobs=True)
    turn = Turn()
    line = json.loads(token_bytes(enc, _chunks("hé")[0], turn))
    assert line["message"]["content"] == "hé" and line["logprobs"][0]["top_logprobs"][1]["token"] == " x"
    assert json.loads(answer_bytes(enc, turn, END))["logprobs"][0]["logprob"] == -0.25
    req = msgspec.convert({"model": "m", "input": "hi", "include": ["message.output_text.logprobs"]}, openai_responses.ResponsesRequest)
    renc = openai_responses.ResponsesEncoder("t", "m", req)
    rturn = Turn()
    delta = token_bytes(renc, _chunks("hé")[0], rturn).decode()
    assert '"logprobs":[{"token":"h' in delta.replace(" ", "")
    out = json.loads(answer_bytes(openai_responses.ResponsesEncoder("t", "m", req), rturn, END))
    assert out["output"][0]["content"][0]["logprobs"][0]["logprob"] == -0.25


def test_thinking_budgets_of_each_family() -> None:
    def chat(**f):
        return openai_chat.chat_params(msgspec.convert({"model": "m", "messages": USER, **f}, openai_chat.ChatCompletionRequest))

    assert chat(reasoning_effort="low").thinking_budget == EFFORT_BUDGETS["low"] == 1024
    assert chat(reasoning_effort="none").thinking_budget is None and chat(reasoning_effort="none").thinking is False
    assert chat().thinking_budget is None
    body = {"model": "m", "max_tokens": 64, "messages": USER}
    enabled = anthropic.messages_params(msgspec.convert({**body, "thinking": {"type": "enabled", "budget_tokens": 32}},
                                                        anthropic.MessagesRequest))
    assert enabled.thinking is True and enabled.thinking_budget == 32
    for bad in (0, "32", True):
        with pytest.raises(ApiError) as info:
            anthropic.messages_params(msgspec.convert({**body, "thinking": {"type": "enabled", "budget_tokens": bad}},
                                                      anthropic.MessagesRequest))
        assert info.value.info.param == "thinking.budget_tokens"
    oll = ollama.chat_params(msgspec.convert({"model": "m", "messages": USER, "think": "high"}, ollama.ChatRequest))
    assert oll.thinking is True and oll.thinking_budget == EFFORT_BUDGETS["high"]
    assert ollama.generate_params(msgspec.convert({"model": "m", "prompt": "hi", "think": True}, ollama.GenerateRequest)).thinking_budget is None
    resp = msgspec.convert({"model": "m", "input": "hi", "reasoning": {"effort": "medium"}}, openai_responses.ResponsesRequest)
    assert openai_responses.responses_params(resp).thinking_budget == EFFORT_BUDGETS["medium"]
