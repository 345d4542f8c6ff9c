"""Prefill shared between clients in the engine (``worker.engine.prefill_slots``), on the tiny
synthetic model, against mlx-lm in process.

One client's long prompts fill the prefill group; another client's short request arriving
then takes a slot at the next step (one of the first client's rows is paused with its KV),
prefills on its own (the long rows are left out for their length, each fed a chunk of its
own in turn), has its first token after its own chunks, and every request's greedy output
still equals mlx-lm's ``generate_step`` on the same prompt: pausing a row (its KV extracted
from the group's merged cache), feeding it alone and merging it back changes nothing.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mlx.core as mx  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402

from tests.support.models.synthetic_models import make_synthetic_model  # noqa: E402
from exo_p2p.types.chunks import FinishChunk, TokenChunk  # noqa: E402
from exo_p2p.types.engine import EngineSettings  # noqa: E402
from exo_p2p.types.tasks import ChatMessage, GenerationParams  # noqa: E402
from worker.engine.builder import build_engine  # noqa: E402
from worker.engine.loading.loader import LoadedModel, load_all  # noqa: E402

CHUNK = 64  # group limit 256 // 64 = 4 rows
MAX_STEPS = 2_000
NEW = 12


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_all(make_synthetic_model(tmp_path_factory.mktemp("fair") / "synthetic", n_layers=2))


def params(text: str, client: str) -> GenerationParams:
    return GenerationParams(messages=(ChatMessage("user", text),), max_tokens=NEW, temperature=0.0, client=client)


def reference(loaded: LoadedModel, p: GenerationParams) -> list[int]:
    """mlx-lm's greedy tokens for ``p``'s prompt, cut at the first end-of-turn token."""
    ids = loaded.tokenizer.apply_chat_template([{"role": "user", "content": p.messages[0].content}],
                                               add_generation_prompt=True)
    out: list[int] = []
    for tok, _ in generate_step(mx.array(ids), loaded.model, max_tokens=NEW, prefill_step_size=CHUNK):
        if tok in loaded.eos_token_ids:
            break
        out.append(tok)
    return out


def test_a_second_clients_request_takes_a_slot_and_outputs_equal_mlx_lm(loaded: LoadedModel) -> None:
    longs = {f"a{i}": params(f"story {i}: " + "the quiet river runs past the old mill, " * 20, "a") for i in range(5)}
    short = params("hello there, what is new today? " * 8, "b")  # a few chunks
    tokens: dict[str, list[int]] = {}
    gen = build_engine(loaded, EngineSettings(prefill_chunk_size=CHUNK, max_batch=16),
                       on_token=lambda t, tok: tokens.setdefault(t, []).append(tok))
    for task_id, p in longs.items():
        gen.submit(task_id, p)
    gen.step()
    gen.step()
    assert gen.prefilling is not None and gen.prefilling.task_ids == ["a0", "a1", "a2", "a3"]
    gen.submit("b0", short)
    first: dict[str, int] = {}
    ends: dict[str, FinishChunk] = {}
    for step in range(1, MAX_STEPS):
        for chunk in gen.step():
            if isinstance(chunk, TokenChunk):
                first.setdefault(chunk.task_id, step)
            elif isinstance(chunk, FinishChunk):
                ends[chunk.task_id] = chunk
        if step == 1:  # b took a slot at once and prefills alone: a's rows set aside with their KV
            assert gen.prefilling is not None and gen.prefilling.task_ids == ["b0"]
            assert gen.slots.left_out == ["a0", "a1", "a2"]  # picked, but 4× as long
            assert sorted(s.task_id for s in gen.slots.paused) == ["a0", "a1", "a2", "a3"]
        if not gen.has_work():
            break
    b_chunks = -(-ends["b0"].prompt_tokens // CHUNK)
    assert first["b0"] <= b_chunks + 1, (first, b_chunks)
    assert first["b0"] < min(first[t] for t in longs)
    for task_id, p in [*longs.items(), ("b0", short)]:
        got = [t for t in tokens[task_id] if t not in loaded.eos_token_ids]
        assert got == reference(loaded, p), task_id
    assert not gen.slots.rows and gen.batch_size == 0


def test_a_cancelled_paused_row_ends_and_frees_its_slot(loaded: LoadedModel) -> None:
    gen = build_engine(loaded, EngineSettings(prefill_chunk_size=CHUNK, max_batch=16))
    for i in range(4):
        gen.submit(f"a{i}", params("a long prompt about rivers and mills, " * 20, "a"))
    gen.step()
    gen.submit("b0", params("hello there, what is new today? " * 8, "b"))
    gen.step()
    assert "a3" in [s.task_id for s in gen.slots.paused]
    assert gen.cancel("a3")
    out = gen.step()
    assert any(isinstance(c, FinishChunk) and c.task_id == "a3" and c.finish_reason == "cancelled" for c in out)
    assert "a3" not in [s.task_id for s in gen.slots.rows] and "a3" not in gen.slots.left_out


def test_a_long_prompt_held_back_while_rows_decode_then_fed_alike(tmp_path) -> None:
    """With ``hold_long`` set (the runner's pacer, or the ranks' round), a prompt longer than
    ``LONG_PROMPT_TOKENS`` gets no chunk while a row decodes, the row decodes on; released,
    the prompt prefills and its greedy output still equals mlx-lm's."""
    from worker.engine.fair_share import LONG_PROMPT_TOKENS

    loaded = load_all(make_synthetic_model(tmp_path / "long", n_layers=1, context_length=4096))
    tokens: dict[str, list[int]] = {}
    gen = build_engine(loaded, EngineSettings(prefill_chunk_size=256, max_batch=4),
                       on_token=lambda t, tok: tokens.setdefault(t, []).append(tok))
    gen.submit("d", GenerationParams(messages=(ChatMessage("user", "go on"),), max_tokens=400, temperature=0.0))
    gen.step()
    long = params("the quiet river runs past the old mill, " * 130, "b")
    gen.submit("L", long)
    gen.slots.hold_long = True
    for _ in range(4):
        gen.step()
    held = next(s for s in gen.slots.rows if s.task_id == "L")
    assert int(held.prompt.size) > LONG_PROMPT_TOKENS and held.processed == 0
    assert len(tokens["d"]) >= 4 and not gen.slots.long_fed  # d decoded on
    gen.slots.hold_long = False
    gen.step()
    assert held.processed > 0 and gen.slots.long_fed
    for _ in range(MAX_STEPS):
        if not gen.has_work():
            break
        gen.step()
    assert [t for t in tokens["L"] if t not in loaded.eos_token_ids] == reference(loaded, long)
