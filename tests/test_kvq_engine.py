"""The engine with a quantized KV cache (``--kv-cache-bits``, ``worker/engine/kvq``), in process
on a synthetic model whose heads are 64 wide (float16 KV: the least a q8 cache saves, 1.88×):
rows answer alike alone and batched (prefill groups, joins, drops), a conversation's next
turn reuses its quantized prefix from RAM and from disk (a q8 block never enters a
full-precision cache), speculation rolls a quantized batch back and answers as without it,
and the same ``kv_cache_bytes`` admits ≥ 1.8× the sessions."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from exo_p2p.types.engine import EngineSettings  # noqa: E402
from exo_p2p.types.tasks import ChatMessage, GenerationParams  # noqa: E402
from tests.support.batch_drive import CHUNK, PROMPTS, drive  # noqa: E402
from worker.engine.builder import build_engine  # noqa: E402

pytestmark = pytest.mark.unit


def wide(directory: Path):
    """The synthetic model with 64-wide heads and float16 weights (so float16 KV), loaded."""
    from tests.support.models.synthetic_models import make_synthetic_model
    from worker.engine.loading.loader import load_all

    return load_all(make_synthetic_model(directory / "synthetic", n_layers=2, hidden_size=256, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=256, dtype="float16"))


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return wide(tmp_path_factory.mktemp("kvq"))


def greedy(text: str, n: int = 12) -> GenerationParams:
    return GenerationParams(messages=(ChatMessage("user", text),), max_tokens=n, temperature=0.0)


def engine(loaded, bits: int, **kw):
    return build_engine(loaded, EngineSettings(prefill_chunk_size=CHUNK, kv_cache_bits=bits, **kw))


@pytest.mark.parametrize("bits", [8, 4])
def test_rows_answer_alike_alone_and_batched(loaded, bits: int) -> None:
    alone = {}
    for i, prompt in enumerate(PROMPTS):
        gen = engine(loaded, bits, max_batch=1)
        gen.submit(f"t{i}", greedy(prompt, 6 + 4 * i))
        alone.update(drive(gen)["ids"])
    gen = engine(loaded, bits, max_batch=4)
    for i, prompt in enumerate(PROMPTS):
        gen.submit(f"t{i}", greedy(prompt, 6 + 4 * i))
    got = drive(gen)
    assert got["largest"] >= 2 and type(gen.batch.cache or [None])[0] is not None
    assert got["ids"] == alone


def test_next_turn_reuses_the_quantized_prefix_from_ram_and_disk(loaded, tmp_path: Path) -> None:
    first = greedy(PROMPTS[2])
    cold = engine(loaded, 8, max_batch=2)
    cold.submit("c1", first)
    ids1 = drive(cold)["ids"]["c1"]
    text1 = loaded.tokenizer.decode(ids1)
    second = greedy("")
    second = GenerationParams(messages=(*first.messages, ChatMessage("assistant", text1), ChatMessage("user", "more?")),
                              max_tokens=12, temperature=0.0)
    cold.submit("c2", second)
    want = drive(cold)["ids"]["c2"]

    disk = dict(prompt_cache_bytes=1 << 22, prompt_cache_disk_bytes=1 << 24, prompt_cache_dir=str(tmp_path))
    warm = engine(loaded, 8, max_batch=2, **disk)
    warm.submit("w1", first)
    drive(warm)
    entry = warm.prompt_cache.entries[-1]
    assert type(entry.cache[0]).__name__ == "QuantizedKVCache" and entry.cache[0].bits == 8
    warm.submit("w2", second)
    assert drive(warm)["ids"]["w2"] == want and warm.prompt_cache.hits == 1
    warm.prompt_cache.disk.flush()

    full = engine(loaded, 0, max_batch=2, **disk)  # same directory, full precision: never reads a q8 block
    full.submit("f2", second)
    drive(full)
    assert full.prompt_cache.disk_hits == 0
    restarted = engine(loaded, 8, max_batch=2, **disk)
    restarted.submit("r2", second)
    assert drive(restarted)["ids"]["r2"] == want
    assert restarted.prompt_cache.disk_hits == 1 and restarted.prompt_cache.restored_tokens > 20
    for gen in (warm, full, restarted):
        gen.prompt_cache.disk.close()


def test_speculation_rolls_a_quantized_batch_back_and_answers_alike(tmp_path: Path) -> None:
    loaded = wide(tmp_path)
    for layer in loaded.model.model.layers:  # residual contributions scaled down: the greedy output
        layer.self_attn.o_proj.weight = layer.self_attn.o_proj.weight * 0.15  # repeats spans, so
        layer.mlp.down_proj.weight = layer.mlp.down_proj.weight * 0.15  # drafts are partly accepted
    repeat = "a b c 1 a b c 1 a b c 1"
    runs = []
    for speculative in ("off", "ngram"):
        gen = engine(loaded, 8, max_batch=3, speculative=speculative, num_draft=4)
        for i, prompt in enumerate((repeat, PROMPTS[2], PROMPTS[1])):
            gen.submit(f"s{i}", greedy(prompt, 24))
        runs.append(drive(gen)["ids"])
        if speculative == "ngram":
            stats = gen.batch.spec.stats
            assert 0 < stats.accepted < stats.proposed  # rows rolled back by their own counts
    assert runs[0] == runs[1]


def admitted(loaded, bits: int, budget: int, sessions: int = 40) -> int:
    """The most sessions (a 60-token prompt, 64 new tokens each) decoding at once with
    ``budget`` bytes of KV."""
    gen = engine(loaded, bits, max_batch=sessions, kv_cache_bytes=budget, prompt_cache_bytes=0)
    for i in range(sessions):
        gen.submit(f"a{i}", greedy(f"session {i}: " + "the cat sat on the mat " * 2, 64))
    return drive(gen)["largest"]


def test_the_same_kv_budget_admits_at_least_1_8x_the_sessions(loaded) -> None:
    from worker.engine.batch_memory import model_kv_bytes_per_token

    per_token = model_kv_bytes_per_token(loaded.model)
    budget = 6000 * per_token  # 6,000 full-precision tokens of KV
    full, q8, q4 = (admitted(loaded, bits, budget) for bits in (0, 8, 4))
    print(f"\nsessions admitted with {budget} bytes of KV: full {full}, q8 {q8} ({q8 / full:.2f}x), q4 {q4} ({q4 / full:.2f}x)")
    assert full >= 4
    assert q8 >= 1.8 * full
    assert q4 >= q8


def test_a_model_whose_heads_cannot_be_quantized_is_refused_at_build(tmp_path: Path) -> None:
    from tests.support.models.synthetic_models import make_synthetic_model
    from worker.engine.loading.loader import load_all

    narrow = load_all(make_synthetic_model(tmp_path / "narrow", n_layers=1))  # 16-wide heads
    with pytest.raises(ValueError, match="multiple of 32"):
        engine(narrow, 8, max_batch=2)
    assert engine(narrow, 0, max_batch=2) is not None
