"""Logprobs of generated tokens and the thinking budget, in process on tiny synthetic models.

Oracle for the logprobs: mlx-lm's own ``generate_step`` on the same model and prompt, greedy,
whose second value beside each token is the log-softmax of the model's logits.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from tests.support.engine_run import generate, loaded, model_dir  # noqa: F401 - fixtures
from exo_p2p.types.chunks import TokenChunk
from exo_p2p.types.tasks import GenerationParams
from worker.engine.loading.loader import LoadedModel
from worker.engine.token_logprobs import pack, read, record, unpack

pytestmark = pytest.mark.unit

TOLERANCE = 1e-4
"""The largest |difference| allowed from mlx-lm's log-probabilities (float32 weights)."""


def _oracle(loaded: LoadedModel, prompt: str, n: int) -> list[tuple[int, mx.array]]:
    ids = mx.array(loaded.tokenizer.encode(prompt), dtype=mx.int32)
    out = []
    for (token, logprobs), _ in zip(generate_step(ids, loaded.model, max_tokens=n,
                                                  sampler=lambda x: mx.argmax(x, axis=-1)), range(n), strict=False):
        out.append((int(token), logprobs.reshape(-1)))
    return out


def max_logprob_difference(loaded: LoadedModel, prompt: str, n: int, k: int) -> float:
    """Greedy ``n`` tokens of ``prompt`` with ``k`` alternatives through the engine against
    mlx-lm's ``generate_step``: the largest |difference| over the chosen and top tokens.
    Asserts the same tokens, top lists in order and of the size asked."""
    params = GenerationParams(messages=(), prompt=prompt, max_tokens=n, temperature=0.0, logprobs=k)
    chunks, _ = generate(loaded, ("lp", params))
    got = [c.logprobs for c in chunks if isinstance(c, TokenChunk) and c.token_id is not None]
    want = _oracle(loaded, prompt, n)
    assert got and all(g is not None for g in got)
    worst = 0.0
    for g, (token, row) in zip(got, want, strict=False):
        assert g.chosen.token_id == token
        assert [t.token_id for t in g.top] == [int(i) for i in mx.argsort(-row)[:k].tolist()]
        assert g.chosen.text == loaded.tokenizer.decode([token])
        for t in (g.chosen, *g.top):
            worst = max(worst, abs(t.logprob - float(row[t.token_id].item())))
    return worst


def test_greedy_logprobs_equal_mlx_lm(loaded: LoadedModel) -> None:  # noqa: F811
    worst = max_logprob_difference(loaded, "the quick brown fox", 24, 5)
    print(f"max |logprob difference| = {worst:.3g}")
    assert worst <= TOLERANCE


def test_twenty_alternatives_and_none(loaded: LoadedModel) -> None:  # noqa: F811
    assert max_logprob_difference(loaded, "hello there", 6, 20) <= TOLERANCE
    assert max_logprob_difference(loaded, "hello there", 6, 0) <= TOLERANCE
    plain, _ = generate(loaded, ("p", GenerationParams(messages=(), prompt="hello there", max_tokens=4, temperature=0.0)))
    assert all(c.logprobs is None for c in plain if isinstance(c, TokenChunk))


def test_records_cross_a_pipeline_all_sum_intact() -> None:
    """``pack`` then ``unpack`` (the all-sum adds zeros from the other ranks) gives back
    each row's record and token; a row that asked for none gets its token alone."""
    logits = mx.array([[0.1, 2.0, -1.0, 0.5, 3.0]])
    row = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    rec = record(row, mx.array([1]), 3)
    tokens = mx.array([1, 4], dtype=mx.int32)
    flat = pack(tokens, [rec, None], 3).reshape(-1)
    summed = mx.concatenate([flat + mx.zeros_like(flat), mx.zeros((3,))])
    got_tokens, records = unpack(summed, 2, [3, None])
    assert got_tokens.tolist() == [1, 4] and records[1] is None
    lp = read(records[0].tolist(), 3, str)
    assert lp.chosen.token_id == 1 and [t.token_id for t in lp.top] == [4, 1, 3]
    assert abs(lp.top[0].logprob - float(row[0, 4].item())) < 1e-6


def test_batched_rows_keep_their_own_logprobs(loaded: LoadedModel) -> None:  # noqa: F811
    """Three requests decoding in one batch (one asks for none, one samples): each row's
    values equal the same request's served alone."""
    from tests.support.engine_run import run
    from exo_p2p.types.engine import EngineSettings
    from worker.engine.builder import build_engine

    requests = [("a", GenerationParams(messages=(), prompt="one two", max_tokens=10, temperature=0.0, logprobs=2)),
                ("b", GenerationParams(messages=(), prompt="three", max_tokens=10, temperature=0.0)),
                ("c", GenerationParams(messages=(), prompt="four five six", max_tokens=10, temperature=0.8, seed=1, logprobs=4))]
    gen = build_engine(loaded, EngineSettings(max_batch=4))
    for request in requests:
        gen.submit(*request)
    batched = run(gen)
    for task_id, params in requests:
        alone, _ = generate(loaded, (task_id, params))
        got = [c.logprobs for c in batched if isinstance(c, TokenChunk) and c.task_id == task_id and c.token_id is not None]
        want = [c.logprobs for c in alone if isinstance(c, TokenChunk) and c.token_id is not None]
        assert len(got) == len(want) > 1
        for g, w in zip(got, want, strict=True):
            if w is None:
                assert g is None
                continue
            assert g.chosen.token_id == w.chosen.token_id and [t.token_id for t in g.top] == [t.token_id for t in w.top]
            assert abs(g.chosen.logprob - w.chosen.logprob) <= TOLERANCE
