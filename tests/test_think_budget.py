"""The thinking budget, in process on the tiny think-capable synthetic model.

The prompt opens a think block (raw prompt ending in ``<think>``); the end-of-turn token and
``</think>`` are banned (``logit_bias`` -100), so the random model would reason until
``max_tokens``. The budget forces ``</think>`` (a forced token overrides the bias) after
exactly its count of reasoning tokens, and the answer follows in the content.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.engine_run import generate
from tests.support.models.synthetic_models import make_synthetic_model
from exo_p2p.types.chunks import TokenChunk
from exo_p2p.types.tasks import GenerationParams
from worker.engine.loading.loader import LoadedModel, load_all
from worker.engine.sampling import Sampler
from worker.engine.think_budget import ThinkBudget

pytestmark = pytest.mark.unit

PROMPT = "<|im_start|>user\nthink hard<|im_end|>\n<|im_start|>assistant\n<think>\n"


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_all(make_synthetic_model(tmp_path_factory.mktemp("t") / "agent", agent=True))


def _run(agent: LoadedModel, budget: int | None, **fields) -> tuple[list[TokenChunk], list[int]]:
    eos = tuple((t, -100.0) for t in sorted({*agent.eos_token_ids, agent.tokenizer.think_end_id}))
    fields = {"temperature": 0.0, **fields}
    params = GenerationParams(messages=(), prompt=PROMPT, max_tokens=budget + 24 if budget else 48,
                              logit_bias=eos, thinking_budget=budget, **fields)
    chunks, tokens = generate(agent, ("t", params))
    return [c for c in chunks if isinstance(c, TokenChunk)], tokens


@pytest.mark.parametrize("budget", [1, 5, 32])
def test_the_budget_ends_reasoning_and_the_answer_follows(agent: LoadedModel, budget: int) -> None:
    end = agent.tokenizer.think_end_id
    _, free_tokens = _run(agent, None)
    assert end not in free_tokens
    chunks, tokens = _run(agent, budget)
    assert tokens.index(end) == budget  # exactly `budget` reasoning tokens, then the marker
    assert tokens[:budget] == free_tokens[:budget]  # the budget changes nothing before it runs out
    reasoning = [c for c in chunks if c.reasoning]
    assert reasoning and max(c.completion_tokens for c in reasoning) <= budget + 1
    after = [c for c in chunks if c.completion_tokens > budget + 1]
    assert after and "".join(c.text for c in after).strip() and not any(c.reasoning for c in after)


def test_sampled_temperature_keeps_the_budget(agent: LoadedModel) -> None:
    chunks, tokens = _run(agent, 8, temperature=0.9, seed=3)
    assert tokens.index(agent.tokenizer.think_end_id) == 8


def test_a_block_closed_by_the_model_is_unscheduled() -> None:
    """The model closes its block at draw 2 of a budget of 10: the forced marker (draw 11)
    is taken back; only what is queued already (draw 3) could still be forced, and it is not."""
    sampler = Sampler(GenerationParams(messages=()), 0)
    budget = ThinkBudget(10, (7,))
    budget.start(sampler, True)
    assert sampler.forced == {10: 7}
    budget.consumed(sampler, "reasoning", "reasoning")
    budget.consumed(sampler, "reasoning", "content")
    assert sampler.forced == {} and budget.used == 1
    budget.consumed(sampler, "content", "reasoning")  # a second block: the rest of the budget
    assert sampler.forced == {3 + 9: 7}
    with pytest.raises(ValueError):
        ThinkBudget(0, (7,))
