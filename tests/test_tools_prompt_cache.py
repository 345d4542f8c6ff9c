"""A replayed agent session hits the prompt cache: six turns of a tool loop, each request
made from the OpenAI chat body an agent would send (the API's ``chat_params``) and served by
an in-process engine on the agent synthetic model; before each turn, the share of its prompt
that the prompt cache already holds is measured (``PromptCache.nearest``) and printed."""

from __future__ import annotations

import json

import msgspec

from exo_p2p.api.families.openai.chat import chat_params
from exo_p2p.api.schemas import ChatCompletionRequest
from tests.support.models.synthetic_models import make_synthetic_model
from exo_p2p.types.chunks import FinishChunk, TokenChunk
from exo_p2p.types.engine import EngineSettings
from worker.engine.builder import build_engine
from worker.engine.loading.loader import load_all
from worker.engine.prepare import prompt_ids

TURNS = 6
SYSTEM = "You are a coding agent. Read files before you change them; keep changes small. " * 20
"""An agent's system prompt (real ones are thousands of tokens; this one about 1,400 tokens here)."""
GENERATION_PROMPT_SLACK = 8
"""Tokens at the end of a prompt that the next turn renders differently: the template's
generation prompt (``<|im_start|>assistant`` and, thinking off, an empty think block, which
the history does not repeat — as Qwen3's template does)."""
MAX_STEPS = 500
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string", "maxLength": 16}},
                                                          "required": ["path"], "additionalProperties": False}}}]


def test_every_turn_after_the_first_reuses_most_of_its_prompt(tmp_path, capsys) -> None:
    loaded = load_all(make_synthetic_model(tmp_path / "agent", agent=True, context_length=8192))
    engine = build_engine(loaded, EngineSettings(prompt_cache_bytes=256 * 1024 * 1024))
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fix the bug."}]
    shares, reused, previous = [], [], []
    for turn in range(TURNS):
        body = {"model": "m", "messages": messages, "tools": TOOLS, "tool_choice": "required", "temperature": 0, "max_tokens": 150,
                "enable_thinking": False, "logit_bias": {"2": 100}}  # the end of turn right after a call
        params = chat_params(msgspec.convert(body, ChatCompletionRequest))
        ids = prompt_ids(f"t{turn}", params, loaded, "m")
        assert isinstance(ids, list)
        reused.append(engine.prompt_cache.nearest(ids)[1])
        shares.append(reused[-1] / len(ids))
        previous.append(len(ids))
        engine.submit(f"t{turn}", params)
        chunks: list = []
        for _ in range(MAX_STEPS):
            if not engine.has_work():
                break
            chunks += engine.step()
        calls = [c for t in chunks if isinstance(t, TokenChunk) for c in t.calls]
        assert calls and isinstance(chunks[-1], FinishChunk), chunks[-1]
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]})
        messages += [{"role": "tool", "tool_call_id": c.id, "content": json.dumps({"text": f"line {turn}"})} for c in calls]
    with capsys.disabled():
        print("\nprompt cache reuse per turn:", ", ".join(f"{s:.0%}" for s in shares), f"(prompts of {previous} tokens)")
    assert shares[0] == 0 and all(s >= 0.9 for s in shares[1:]), shares
    # turn N+1 renders turn N's prompt unchanged up to its generation prompt
    assert all(r >= p - GENERATION_PROMPT_SLACK for r, p in zip(reused[1:], previous, strict=False)), (reused, previous)
