"""Resuming a generation from the tokens already sent (``exo_p2p.api.generation.resume``), on the engine alone.

A request cut after k tokens and resumed with ``resume_tokens`` = those k tokens (a new task
id, the first one as ``origin_task_id``) must continue exactly like the uninterrupted run:
the same tokens (greedy and seeded sampling, penalties included), the same text pieces after
the cut (detokenizer and stop matcher carried over), the same usage counts."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.support.models.synthetic_models import make_synthetic_model  # noqa: E402
from exo_p2p.types import ErrorChunk, FinishChunk, TokenChunk  # noqa: E402
from exo_p2p.types.tasks import ChatMessage, GenerationParams  # noqa: E402
from worker.engine.loading.loader import LoadedModel, load_all  # noqa: E402
from worker.engine.sampling import Sampler, step_key_seed  # noqa: E402
from tests.support.engine_run import generate  # noqa: E402

PROMPT = "and the cat sat on the mat, the cat sat on the mat"


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_all(make_synthetic_model(tmp_path_factory.mktemp("m") / "synthetic"))


def _run(loaded: LoadedModel, task_id: str, resume: tuple[int, ...] = (), **fields):
    params = GenerationParams(messages=(ChatMessage("user", PROMPT),), resume_tokens=resume,
                              origin_task_id="first" if resume else None, **fields)
    chunks, _ = generate(loaded, (task_id, params), prefill_chunk_size=8, max_batch=1)  # one at a time, as before
    tokens = [c for c in chunks if isinstance(c, TokenChunk)]
    ends = [c for c in chunks if isinstance(c, (FinishChunk, ErrorChunk))]
    assert len(ends) == 1
    return tokens, ends[0]


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 0},
        {"temperature": 1.2, "seed": 11},
        {"temperature": 1.0},  # no seed: derived from the first task id on both runs
        {"temperature": 0.9, "seed": 5, "top_k": 20, "presence_penalty": 0.5, "repetition_penalty": 1.3},
        {"temperature": 0, "stop": ("the", "mat")},
    ],
)
@pytest.mark.parametrize("cut", [1, 7, 19])
def test_resumed_run_equals_the_uninterrupted_one(loaded: LoadedModel, fields: dict, cut: int) -> None:
    full, full_end = _run(loaded, "first", max_tokens=24, **fields)
    assert isinstance(full_end, FinishChunk)
    if cut >= len(full):
        pytest.skip(f"the run ended before token {cut}")
    sent = tuple(c.token_id for c in full[:cut])
    assert all(t is not None for t in sent)
    rest, end = _run(loaded, "second", resume=sent, max_tokens=24, **fields)  # type: ignore[arg-type]
    assert isinstance(end, FinishChunk), end
    assert [(c.text, c.completion_tokens, c.token_id) for c in rest] == [(c.text, c.completion_tokens, c.token_id) for c in full[cut:]]
    assert (end.finish_reason, end.prompt_tokens, end.completion_tokens, end.stop_sequence) == (
        full_end.finish_reason, full_end.prompt_tokens, full_end.completion_tokens, full_end.stop_sequence)


def test_resume_after_the_last_allowed_token_only_finishes(loaded: LoadedModel) -> None:
    full, full_end = _run(loaded, "first", max_tokens=6, temperature=0)
    assert full_end.finish_reason == "length"
    sent = tuple(c.token_id for c in full)
    rest, end = _run(loaded, "second", resume=sent, max_tokens=6, temperature=0)  # type: ignore[arg-type]
    assert "".join(c.text for c in rest) == "" and isinstance(end, FinishChunk)
    assert (end.finish_reason, end.completion_tokens) == ("length", 6)


def test_resume_beyond_max_tokens_is_refused(loaded: LoadedModel) -> None:
    _, end = _run(loaded, "second", resume=(5,) * 7, max_tokens=6, temperature=0)
    assert isinstance(end, ErrorChunk) and end.error.status == 400


def test_each_draw_key_depends_on_seed_and_position_only() -> None:
    import mlx.core as mx

    logprobs = mx.log(mx.ones((1, 50)) / 50)
    params = GenerationParams(messages=(), temperature=1.0, top_p=1.0)
    a = Sampler(params, 3, prompt=[1, 2, 3])
    draws = [a(logprobs).item() for _ in range(6)]
    b = Sampler(params, 3, prompt=[9, 9, 9, 9, 9])  # starts at position 5
    assert [b(logprobs).item() for _ in range(4)] == draws[2:]
    assert len({step_key_seed(3, p) for p in range(1000)}) == 1000
    assert step_key_seed(3, 10) != step_key_seed(4, 10)
