"""A pipeline rank's layers run by the family's own forward (worker/engine/layer_span.py), in
process: for every family of ``tests.support.models.synthetic_families``, the ranks of a 2- and a
3-rank split, chained by hand (rank r's output is rank r + 1's input, as the ring carries
it), give the whole model's logits at every step — a prompt longer than the sliding window
in two chunks, then greedy decode steps — alone and as a left-padded batch of two rows.
The real ring, the engine and the runner: tests/test_family_matrix.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.models.synthetic_families import FAMILIES, SLIDING_WINDOW
from worker.engine.layer_span import stand_in_indices

ATOL = 1e-4
"""Logits of a chained split vs the whole model (float32; the same ops, so in practice equal)."""

PROMPT = [5 + (i * 37) % 250 for i in range(2 * SLIDING_WINDOW + 5)]  # 21 tokens > the window
SPLITS = {2: [(0, 2), (2, 4)], 3: [(0, 1), (1, 3), (3, 4)]}


@given(st.lists(st.sampled_from(["full", "slide8", "slide4"]), min_size=1, max_size=12), st.data())
def test_stand_ins_are_local_and_of_the_same_kind_when_one_is(kinds: list[str], data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(kinds) - 1))
    end = data.draw(st.integers(start + 1, len(kinds)))
    got = stand_in_indices(tuple(kinds), start, end)
    local = kinds[start:end]
    assert len(got) == len(kinds)
    for i, j in enumerate(got):
        assert 0 <= j < end - start
        if start <= i < end:
            assert j == i - start
        elif kinds[i] in local:
            assert j == local.index(kinds[i])
        else:
            assert j == 0


def test_stand_ins_refuse_a_range_outside_the_model() -> None:
    with pytest.raises(ValueError, match="not within"):
        stand_in_indices(("a", "b"), 1, 3)
    with pytest.raises(ValueError, match="not within"):
        stand_in_indices(("a", "b"), 1, 1)


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.support.models.synthetic_families import make_family_model

    root = tmp_path_factory.mktemp("families")
    return {f: make_family_model(root / f, f) for f in FAMILIES}


def _chain(ranks: list[Any], tokens: Any, caches: list[list[Any]]) -> Any:
    """The logits of ``tokens`` through ``ranks`` (each a loaded partial model) in order."""
    out = None
    for loaded, cache in zip(ranks, caches, strict=True):
        out = loaded.model.layer_span.run(tokens, cache, out)
    return out


def _steps(run: Any, new_caches: Any, rows: list[list[int]]) -> list[Any]:
    """Logits ``[B, vocab]`` of the last position after each of: the prompt's first half, its
    second half, then 3 greedy tokens — ``rows`` left-padded into one batch when B > 1."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    half = len(rows[0]) // 2
    caches = new_caches()
    if len(rows) > 1:  # one batch cache per layer, as the engine's prefill group makes them
        caches = [[BatchKVCache.merge([c] * len(rows)) for c in rank] for rank in caches]
    out = []
    tokens = mx.array([r[:half] for r in rows])
    for chunk in (tokens, mx.array([r[half:] for r in rows])):
        logits = run(chunk, caches)[:, -1]
        out.append(logits)
    for _ in range(3):
        nxt = mx.argmax(out[-1], axis=-1)[:, None]
        out.append(run(nxt, caches)[:, -1])
    mx.eval(out)
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_chained_ranks_give_the_whole_models_logits(family_dirs: dict[str, Path], family: str) -> None:
    import numpy as np

    from worker.engine.forward import new_cache
    from worker.engine.loading.loader import load_all

    whole = load_all(family_dirs[family])
    want = _steps(lambda t, c: whole.model(t, cache=c[0]), lambda: [new_cache(whole.model)], [PROMPT])
    assert float(np.abs(np.array(want[0])).max()) > 1.0  # not flat logits
    for world, split in SPLITS.items():
        ranks = [load_all(family_dirs[family], start_layer=s, end_layer=e) for s, e in split]
        got = _steps(lambda t, c: _chain(ranks, t, c), lambda: [new_cache(r.model) for r in ranks], [PROMPT])
        for step, (g, w) in enumerate(zip(got, want, strict=True)):
            diff = float(np.abs(np.array(g) - np.array(w)).max())
            assert diff <= ATOL, (family, world, step, diff)


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "gpt_oss", "deepseek_v3"])
def test_a_left_padded_batch_row_equals_the_row_alone(family_dirs: dict[str, Path], family: str) -> None:
    """Two rows whose shorter one is left-padded (a batch cache's mask) through a 2-rank
    chain: each row's logits equal the whole model's for that row alone."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import BatchKVCache

    from worker.engine.forward import new_cache
    from worker.engine.loading.loader import load_all

    whole = load_all(family_dirs[family])
    ranks = [load_all(family_dirs[family], start_layer=s, end_layer=e) for s, e in SPLITS[2]]
    short = PROMPT[:13]
    solo = []
    for row in (PROMPT, short):
        cache = new_cache(whole.model)
        logits = whole.model(mx.array([row]), cache=cache)[:, -1]
        solo.append(np.array(logits[0]))
    caches = []
    for r in ranks:
        caches.append([BatchKVCache([0, len(PROMPT) - len(short)]) for _ in new_cache(r.model)])
    padded = mx.array([PROMPT, [0] * (len(PROMPT) - len(short)) + short])
    got = np.array(_chain(ranks, padded, caches)[:, -1])
    for i in range(2):
        assert float(np.abs(got[i] - solo[i]).max()) <= ATOL, (family, i)


def _engine_tokens(loaded: Any, prompts: list[str], max_batch: int) -> dict[str, list[int]]:
    from exo_p2p.types.engine import EngineSettings
    from exo_p2p.types.tasks import ChatMessage, GenerationParams
    from worker.engine.builder import build_engine

    tokens: dict[str, list[int]] = {}
    engine = build_engine(loaded, EngineSettings(prefill_chunk_size=16, max_batch=max_batch),
                          on_token=lambda t, tok: tokens.setdefault(t, []).append(tok))
    for i, prompt in enumerate(prompts):
        engine.submit(f"p{i}", GenerationParams(messages=(ChatMessage("user", prompt),), max_tokens=8,
                                                temperature=0.0))
    for _ in range(1000):
        if not engine.has_work():
            break
        engine.step()
    return tokens


@pytest.mark.parametrize("family", ["gpt_oss", "gemma3_text"])
def test_a_sliding_window_family_answers_alone_as_in_a_batch(family_dirs: dict[str, Path], family: str) -> None:
    """One rank: a request decoded alone (its own cache, joined to the decode batch after its
    prefill) gives the tokens it gives prefilled and decoded with others, and those of a
    plain greedy loop over the whole model. Prompts are longer than the window: a rotating
    cache merged into the batch after it dropped tokens lost their positions (gpt_oss
    answered otherwise alone)."""
    import mlx.core as mx

    from worker.engine.forward import new_cache
    from worker.engine.loading.loader import load_all

    loaded = load_all(family_dirs[family])
    prompts = ["hello", "and the cat sat on the mat, " * 3]
    alone = _engine_tokens(loaded, prompts, 1)
    assert alone == _engine_tokens(loaded, prompts, 4)
    ids = loaded.tokenizer.apply_chat_template([{"role": "user", "content": prompts[0]}], add_generation_prompt=True)
    assert len(ids) > SLIDING_WINDOW
    cache, x, want = new_cache(loaded.model), mx.array([ids]), []
    for _ in range(8):
        want.append(int(mx.argmax(loaded.model(x, cache=cache)[:, -1], axis=-1).item()))
        x = mx.array([[want[-1]]])
    assert alone["p0"] == want


def test_the_view_runs_the_modules_a_float32_rank_holds(tmp_path: Path) -> None:
    """A rank expanded to float32 (quantized embedding and layers replaced by float32
    modules): the view runs those, not the quantized ones the loader replaced."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    from tests.support.models.synthetic_models import make_synthetic_model
    from worker.engine.loading.loader import load_all

    q4 = make_synthetic_model(tmp_path / "q4", n_layers=4, quantize=True)
    for start, end in SPLITS[2]:
        loaded = load_all(q4, start_layer=start, end_layer=end, weights_dtype="float32")
        view = loaded.model.layer_span.view
        assert not any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in view.named_modules())
        held = {id(a) for _, a in tree_flatten(loaded.model.parameters())}
        assert {id(a) for _, a in tree_flatten(view.parameters())} <= held
