"""Sampling parameters every API family needs (worker/engine/sampling.py) on the tiny
synthetic model: logit bias, penalties (parity with mlx-lm's logits processors), top-k,
min-p, raw prompts, no max_tokens, any number of stop strings and the matched stop."""

from __future__ import annotations

import os
from pathlib import Path

import mlx.core as mx
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.sample_utils import make_logits_processors  # noqa: E402

from tests.support.models.synthetic_models import make_synthetic_model  # noqa: E402
from exo_p2p.types.tasks import ChatMessage, GenerationParams  # noqa: E402
from worker.engine.loading.loader import LoadedModel, load_all  # noqa: E402
from worker.engine.sampling import Sampler  # noqa: E402
from tests.support.engine_run import finish_of, msgs, text_of  # noqa: E402
from tests.support.engine_run import generate as generate_alone  # noqa: E402

PROMPT = "and the cat sat on the mat, the cat sat on the mat"


def chat(text: str) -> tuple[ChatMessage, ...]:
    return (ChatMessage("user", text),)


def generate(loaded: LoadedModel, task_id: str, params: GenerationParams) -> tuple[list, list[int]]:
    """``tests.support.engine_run.generate`` of one request with the old engine's defaults (one
    request at a time, prefill chunks of 256)."""
    return generate_alone(loaded, (task_id, params), max_batch=1, prefill_chunk_size=256)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_all(make_synthetic_model(tmp_path_factory.mktemp("m") / "synthetic"))


def ids_of(loaded: LoadedModel, text: str = PROMPT) -> list[int]:
    return loaded.tokenizer.apply_chat_template(msgs(text), add_generation_prompt=True)


def reference(loaded: LoadedModel, ids: list[int], n: int, **processors) -> list[int]:
    """mlx-lm's greedy tokens with ``make_logits_processors(**processors)``."""
    out = []
    for tok, _ in generate_step(mx.array(ids), loaded.model, max_tokens=n,
                                logits_processors=make_logits_processors(**processors)):
        if tok in loaded.eos_token_ids:
            break
        out.append(tok)
    return out


def tokens(loaded: LoadedModel, n: int = 24, **fields) -> list[int]:
    _, got = generate(loaded, "t", GenerationParams(messages=chat(PROMPT), max_tokens=n, **fields))
    return [t for t in got if t not in loaded.eos_token_ids]


def test_a_banned_token_never_appears_greedy_or_sampled(loaded: LoadedModel) -> None:
    plain = tokens(loaded, temperature=0)
    banned = max(set(plain), key=plain.count)  # the token greedy decoding uses most
    for fields in ({"temperature": 0}, {"temperature": 1.0, "seed": 3}, {"temperature": 1.0, "seed": 4}):
        got = tokens(loaded, logit_bias=((banned, -100.0),), **fields)
        assert banned not in got and got
    forced = tokens(loaded, n=5, temperature=0, logit_bias=((65, 100.0),))
    assert forced == [65] * 5  # +100 makes a token win every step


@pytest.mark.parametrize("processors", [
    {"presence_penalty": 1.5},
    {"frequency_penalty": 0.7},
    {"presence_penalty": 0.5, "frequency_penalty": 0.5},
])
def test_additive_penalties_equal_mlx_lm(loaded: LoadedModel, processors: dict) -> None:
    ids = ids_of(loaded)
    ref = reference(loaded, ids, 24, **processors, presence_context_size=20, frequency_context_size=20)
    assert ref != reference(loaded, ids, 24)  # the penalty changes this model's greedy text
    assert tokens(loaded, temperature=0, penalty_context=20, **processors) == ref


def test_repetition_penalty_breaks_repetition(loaded: LoadedModel) -> None:
    plain = tokens(loaded, n=40, temperature=0)
    penalized = tokens(loaded, n=40, temperature=0, repetition_penalty=3.0, penalty_context=64)
    assert penalized != plain
    assert len(set(penalized)) > len(set(plain))


def test_top_k_one_and_min_p_one_are_greedy(loaded: LoadedModel) -> None:
    greedy = tokens(loaded, temperature=0)
    assert tokens(loaded, temperature=1.5, seed=9, top_k=1) == greedy
    assert tokens(loaded, temperature=1.5, seed=9, min_p=1.0) == greedy
    assert tokens(loaded, temperature=1.5, seed=9) != greedy  # without them it is not


def test_top_k_keeps_draws_among_the_k_best() -> None:
    logprobs = mx.log(mx.array([[0.05, 0.4, 0.3, 0.2, 0.05]]))
    sampler = Sampler(GenerationParams(messages=(), temperature=1.0, top_p=1.0, top_k=2), 1)
    draws = {int(sampler(logprobs).item()) for _ in range(200)}
    assert draws == {1, 2}


def test_raw_prompt_without_chat_template(tmp_path: Path) -> None:
    bare = load_all(make_synthetic_model(tmp_path / "bare", chat_template=None))
    ids = list(bare.tokenizer.encode("the cat sat"))
    chunks, got = generate(bare, "r", GenerationParams(messages=(), prompt="the cat sat", max_tokens=10, temperature=0))
    assert finish_of(chunks, "r").prompt_tokens == len(ids)
    assert [t for t in got if t not in bare.eos_token_ids] == reference(bare, ids, 10)


def test_no_max_tokens_runs_until_the_context_is_full(tmp_path: Path) -> None:
    small = load_all(make_synthetic_model(tmp_path / "ctx", context_length=48))
    n = len(ids_of(small, "hi"))
    banned_eos = tuple((e, -100.0) for e in small.eos_token_ids)  # so only the context can end it
    chunks, _ = generate(small, "c", GenerationParams(messages=chat("hi"), temperature=0, logit_bias=banned_eos))
    fin = finish_of(chunks, "c")
    assert (fin.finish_reason, fin.completion_tokens) == ("length", 48 - n)


def test_many_stop_strings_and_the_matched_one_is_reported(loaded: LoadedModel) -> None:
    chunks, _ = generate(loaded, "s", GenerationParams(messages=chat(PROMPT), max_tokens=40, temperature=0))
    full = text_of(chunks)
    assert len(full) > 8
    stop = full[5:8]
    stops = tuple(f"\u2603never{i}" for i in range(50)) + (stop,)
    chunks, _ = generate(loaded, "s", GenerationParams(messages=chat(PROMPT), max_tokens=40, temperature=0, stop=stops))
    fin = finish_of(chunks, "s")
    assert text_of(chunks) == full[: full.find(stop)]
    assert fin.finish_reason == "stop" and fin.stop_sequence == stop
    eot = finish_of(generate(loaded, "e", GenerationParams(messages=chat("hi"), max_tokens=40, temperature=0))[0], "e")
    assert eot.stop_sequence is None
