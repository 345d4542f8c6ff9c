"""The MLX engine (worker/engine/) on tiny synthetic models: loading, greedy parity with
mlx-lm, sampling seeds, stops, queueing, cancellation and the 400s of a missing chat template or a prompt over the context."""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from mlx_lm.generate import generate_step, stream_generate  # noqa: E402
from mlx_lm.utils import load as mlx_lm_load  # noqa: E402

from tests.support.models.synthetic_models import CHATML_TEMPLATE, make_synthetic_model  # noqa: E402
from exo_p2p.types.chunks import (  # noqa: E402
    ErrorChunk,
    FinishChunk,
    PrefillProgressChunk,
    TokenChunk,
)
from exo_p2p.types.tasks import ChatMessage, GenerationParams  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from exo_p2p.types.engine import EngineSettings  # noqa: E402
from worker.engine.builder import build_engine  # noqa: E402
from worker.engine.prepare import validate_prompt  # noqa: E402
from worker.engine.scheduler import Engine  # noqa: E402
from worker.engine.pipeline import LocalStage, StageFailed  # noqa: E402
from worker.engine.loading.loader import LoadedModel, LoadProgress, load_all, load_model  # noqa: E402
from tests.support.engine_run import MAX_STEPS, Request, finish_of, generate, loaded, model_dir, msgs, run, text_of

PROMPTS = [
    "hello",
    "What is the capital of France?",
    "and the cat sat on the mat, " * 12,  # > 16 tokens: several prefill chunks of 16
    "héllo wörld 日本語 🙂",
]


def req(task_id: str, text: str, **params) -> Request:
    """A chat request of one user message: (task id, its parameters)."""
    return task_id, GenerationParams(messages=(ChatMessage("user", text),), **params)


def reference_greedy(loaded: LoadedModel, prompt_ids: list[int], n: int, chunk: int) -> list[int]:
    """mlx-lm's own greedy tokens for ``prompt_ids``, cut at the first end-of-turn token."""
    out: list[int] = []
    for tok, _ in generate_step(mx.array(prompt_ids), loaded.model, max_tokens=n,
                                prefill_step_size=chunk):
        if tok in loaded.eos_token_ids:
            break
        out.append(tok)
    return out


# -- loading ---------------------------------------------------------------------------------


def test_load_reports_progress_and_end_of_turn_tokens(model_dir: Path) -> None:
    items = list(load_model(model_dir))
    progress, last = items[:-1], items[-1]
    assert [(p.layers_loaded, p.layers_total) for p in progress] == [(i, 4) for i in range(5)]
    assert isinstance(last, LoadedModel) and all(isinstance(p, LoadProgress) for p in progress)
    vocab = last.tokenizer.get_vocab()
    assert {vocab["<|im_end|>"], vocab["<|endoftext|>"]} <= last.eos_token_ids
    assert last.context_length == 2048 and last.is_full and last.peak_memory_bytes > 0


def test_partial_load_reads_only_its_share(tmp_path: Path) -> None:
    d = make_synthetic_model(tmp_path / "big", n_layers=8, hidden_size=256,
                             intermediate_size=768, num_attention_heads=8, num_key_value_heads=4)
    full = load_all(d)
    full_peak, full_layers = full.peak_memory_bytes, len(full.model.layers)
    del full
    first = load_all(d, start_layer=0, end_layer=4)
    first_peak = first.peak_memory_bytes
    assert len(first.model.layers) == 4 and "embed_tokens" in first.model.model
    assert "norm" not in first.model.model
    del first
    middle_items = list(load_model(d, start_layer=2, end_layer=5))
    middle = middle_items[-1]
    assert [p.layers_loaded for p in middle_items[:-1]] == [0, 1, 2, 3]
    assert "embed_tokens" not in middle.model.model and "norm" not in middle.model.model
    assert full_layers == 8
    # Half the layers (plus the small embedding) → well under the full peak.
    assert first_peak < 0.6 * full_peak, (first_peak, full_peak)
    assert middle.peak_memory_bytes < 0.45 * full_peak, (middle.peak_memory_bytes, full_peak)


def test_bad_layer_range_is_an_error(model_dir: Path) -> None:
    with pytest.raises(ValueError, match="layer range"):
        list(load_model(model_dir, start_layer=3, end_layer=9))


def test_quantized_model_with_per_module_override_matches_mlx_lm(tmp_path: Path) -> None:
    d = make_synthetic_model(tmp_path / "q", quantize=True)
    ours = load_all(d)
    assert ours.model.model.embed_tokens.bits == 8
    assert ours.model.model.layers[0].mlp.up_proj.bits == 4
    ref_model, ref_tok = mlx_lm_load(str(d))
    ids = ref_tok.apply_chat_template(msgs("hello the world"), add_generation_prompt=True)
    ref = [t for t, _ in generate_step(mx.array(ids), ref_model, max_tokens=12)]
    _, got = generate(ours, req("q", "hello the world", max_tokens=12,
                                              temperature=0))
    assert got == [t for t in ref[: len(got)]] and len(got) >= 1


# -- greedy parity with mlx-lm ---------------------------------------------------------------


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_equal_mlx_lm(loaded: LoadedModel, prompt: str) -> None:
    ids = loaded.tokenizer.apply_chat_template(msgs(prompt), add_generation_prompt=True)
    ref = reference_greedy(loaded, ids, 24, chunk=16)
    chunks, got = generate(loaded, req("g", prompt, max_tokens=24,
                                                     temperature=0), prefill_chunk_size=16)
    got = [t for t in got if t not in loaded.eos_token_ids]
    assert got == ref
    prefill = [c for c in chunks if isinstance(c, PrefillProgressChunk)]
    assert prefill[0].processed == 0 and prefill[-1].processed == len(ids)
    if len(ids) > 17:
        assert len(prefill) >= 4  # accepted, ≥ 2 chunks of 16, done
    assert finish_of(chunks, "g").prompt_tokens == len(ids)


def test_streamed_text_equals_mlx_lm_stream_generate(loaded: LoadedModel) -> None:
    prompt = PROMPTS[3]
    ids = loaded.tokenizer.apply_chat_template(msgs(prompt), add_generation_prompt=True)
    ref = "".join(r.text for r in stream_generate(loaded.model, loaded.tokenizer, ids,
                                                  max_tokens=30))
    chunks, _ = generate(loaded, req("s", prompt, max_tokens=30,
                                                   temperature=0))
    assert text_of(chunks) == ref


# -- sampling ---------------------------------------------------------------------------------


def test_same_seed_same_output_different_seed_differs(loaded: LoadedModel) -> None:
    def sample(seed: int, task: str) -> list[int]:
        return generate(loaded, req(task, "hello", max_tokens=20, temperature=1.0, top_p=0.95, seed=seed))[1]

    a1, a2, b = sample(7, "a"), sample(7, "b"), sample(8, "c")
    assert a1 == a2
    assert a1 != b


def test_no_seed_varies_by_task(loaded: LoadedModel) -> None:
    outs = {tuple(generate(loaded, req(f"t{i}", "hi", max_tokens=12,
                                                     temperature=1.0))[1]) for i in range(3)}
    assert len(outs) > 1


# -- ends: max_tokens, end-of-turn, stop strings, context -----------------------------------


def test_max_tokens_gives_length(loaded: LoadedModel) -> None:
    chunks, got = generate(loaded, req("m", "hello", max_tokens=7,
                                                     temperature=0))
    fin = finish_of(chunks, "m")
    assert fin.finish_reason == "length" and fin.completion_tokens == 7 == len(got)
    assert [c.completion_tokens for c in chunks if isinstance(c, TokenChunk)][-1] == 7
    assert fin.ttft > 0 and fin.decode_tokens_per_second > 0


def test_end_of_turn_token_stops(loaded: LoadedModel) -> None:
    ids = loaded.tokenizer.apply_chat_template(msgs("hello"), add_generation_prompt=True)
    ref = reference_greedy(loaded, ids, 20, chunk=256)
    k = 6
    eos = ref[k]
    first = ref.index(eos)
    scripted = dataclasses.replace(loaded, eos_token_ids=frozenset({eos}))
    chunks, _ = generate(scripted, req("e", "hello", max_tokens=50,
                                                     temperature=0))
    fin = finish_of(chunks, "e")
    assert fin.finish_reason == "stop" and fin.completion_tokens == first
    full = loaded.tokenizer.decode(ref[:first])
    assert text_of(chunks) == full.lstrip(" ") or text_of(chunks) == full


def test_stop_string_across_tokens(loaded: LoadedModel) -> None:
    prompt = "what can you do"
    chunks, _ = generate(loaded, req("x", prompt, max_tokens=40,
                                                        temperature=0))
    segments = [c.text for c in chunks if isinstance(c, TokenChunk)]
    full = "".join(segments)
    ends, pos = [], 0
    for s in segments:
        pos += len(s)
        ends.append(pos)
    # A 3-character stop string that spans a segment boundary, first occurring there.
    stop = None
    for i, e in enumerate(ends[:-1]):
        if 0 < e - 1 and e + 2 <= len(full) and segments[i] and segments[i + 1]:
            cand = full[e - 1 : e + 2]
            if full.find(cand) == e - 1:
                stop, at = cand, e - 1
                break
    assert stop is not None, full
    chunks2, _ = generate(loaded, req("y", prompt, max_tokens=40,
                                                    temperature=0, stop=(stop, "\u2603never")))
    fin = finish_of(chunks2, "y")
    emitted = text_of(chunks2)
    assert fin.finish_reason == "stop" and emitted == full[:at]
    # completion_tokens: the tokens up to and including the one that completed the stop.
    assert fin.completion_tokens == next(i + 1 for i, e in enumerate(ends) if e >= at + len(stop))
    so_far = ""
    for c in chunks2:
        if isinstance(c, TokenChunk):
            so_far += c.text
            assert stop not in so_far and len(so_far) <= at


def test_prompt_longer_than_context_is_400_before_prefill(tmp_path: Path) -> None:
    small = load_all(make_synthetic_model(tmp_path / "ctx", context_length=64))
    gen = build_engine(small)
    gen.submit(*req("long", "the cat " * 40, max_tokens=10))
    gen.submit(*req("ok", "hi", max_tokens=3, temperature=0))
    t0 = time.process_time()  # CPU time of this process: a loaded machine does not stretch it
    first = gen.step()  # refuses the long prompt, then accepts and prefills the short one
    assert time.process_time() - t0 < 1.0  # no prefill of the long prompt (the step only refuses it)
    assert isinstance(first[0], ErrorChunk) and first[0].task_id == "long"
    assert not any(c.task_id == "long" for c in first[1:])
    err = first[0].error
    assert err.status == 400 and "but the model's context is 64 tokens" in err.message
    assert err.message.startswith("prompt is ") and int(err.message.split()[2]) > 64
    # the counts travel with it, for each family's own words (exo_p2p.api.errors.overflow_message)
    assert (err.code, err.prompt_tokens, err.context_tokens) == ("context_length_exceeded", int(err.message.split()[2]), 64)
    rest = first[1:] + run(gen)  # the engine keeps serving the next request
    assert finish_of(rest, "ok").completion_tokens == 3


def test_prompt_plus_max_tokens_over_context_is_clamped(tmp_path: Path) -> None:
    small = load_all(make_synthetic_model(tmp_path / "ctx", context_length=40))
    n = len(small.tokenizer.apply_chat_template(msgs("the cat sat"), add_generation_prompt=True))
    assert n < 40
    chunks, _ = generate(small, req("c", "the cat sat", max_tokens=500,
                                                  temperature=0))
    fin = finish_of(chunks, "c")
    # Either an end-of-turn token came first, or the context filled up.
    assert (fin.finish_reason, fin.completion_tokens) == ("length", 40 - n) or \
        (fin.finish_reason == "stop" and fin.completion_tokens < 40 - n)


# -- chat templates ---------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["config", "jinja"])
def test_chat_template_in_either_place(tmp_path: Path, where: str) -> None:
    d = make_synthetic_model(tmp_path / where, chat_template=where)
    assert (d / "chat_template.jinja").exists() == (where == "jinja")
    ours = load_all(d)
    _, ref_tok = mlx_lm_load(str(d))
    ids = ref_tok.apply_chat_template(msgs("hello"), add_generation_prompt=True)
    assert ids == ref_tok.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
                                 add_special_tokens=False)
    assert ours.tokenizer.chat_template == CHATML_TEMPLATE
    chunks, got = generate(ours, req("t", "hello", max_tokens=8,
                                                   temperature=0))
    assert finish_of(chunks, "t").prompt_tokens == len(ids)
    assert got[:8] == reference_greedy(ours, ids, 8, chunk=256)[: len(got)]


def test_missing_chat_template_is_400_and_generator_goes_on(tmp_path: Path) -> None:
    bare = load_all(make_synthetic_model(tmp_path / "bare", chat_template=None))
    gen = build_engine(bare, model_id="bare-model")
    gen.submit(*req("a", "hello"))
    gen.submit(*req("b", "hello"))
    chunks = run(gen)
    assert [type(c) for c in chunks] == [ErrorChunk, ErrorChunk]
    assert all(c.error.status == 400 and c.error.message == "model bare-model has no chat template"
               for c in chunks)
    assert not gen.has_work()


# -- queueing and cancellation ----------------------------------------------------------------


def steps_until(gen: Engine, pred, bound: int = MAX_STEPS) -> Iterator:
    for _ in range(bound):
        chunks = gen.step()
        yield from chunks
        if any(pred(c) for c in chunks):
            return
    raise AssertionError("condition not reached")


def test_request_submitted_while_generating_is_served_after(loaded: LoadedModel) -> None:
    solo_b, _ = generate(loaded, req("b", "second", max_tokens=6,
                                                   temperature=0))
    gen = build_engine(loaded, EngineSettings(max_batch=1))
    gen.submit(*req("a", "first", max_tokens=10, temperature=0))
    chunks = list(steps_until(gen, lambda c: isinstance(c, TokenChunk) and c.completion_tokens == 3))
    gen.submit(*req("b", "second", max_tokens=6, temperature=0))
    assert gen.queued_task_ids == ["b"] and [row.task_id for row in gen.batch.rows] == ["a"]
    chunks += run(gen)
    order = [c.task_id for c in chunks]
    assert order.index("b") > max(i for i, t in enumerate(order) if t == "a")
    assert finish_of(chunks, "a").completion_tokens == 10
    assert text_of(chunks, "b") == text_of(solo_b) and finish_of(chunks, "b").completion_tokens == 6


def test_finish_tells_the_wait_in_the_queue_apart(loaded: LoadedModel) -> None:
    """``FinishChunk.queued`` is the part of the TTFT spent waiting to be accepted: a request
    behind a full batch waits at least the decode steps of the one before it (the engine's
    clock ticks once a call here, at least once a decode step)."""
    ticks = itertools.count()
    gen = build_engine(loaded, EngineSettings(max_batch=1), clock=lambda: float(next(ticks)))
    gen.submit(*req("a", "first", max_tokens=10, temperature=0))
    chunks = list(steps_until(gen, lambda c: isinstance(c, TokenChunk) and c.completion_tokens == 3))
    gen.submit(*req("b", "second", max_tokens=6, temperature=0))
    chunks += run(gen)
    a, b = finish_of(chunks, "a"), finish_of(chunks, "b")
    assert 0 < a.queued < a.ttft
    assert 7 <= b.queued < b.ttft


def test_cancel_mid_generation_is_prompt(loaded: LoadedModel) -> None:
    gen = build_engine(loaded, EngineSettings(max_batch=1))
    gen.submit(*req("long", "go", max_tokens=1000, temperature=0))
    gen.submit(*req("queued", "go", max_tokens=5, temperature=0))
    gen.submit(*req("next", "go", max_tokens=4, temperature=0))
    list(steps_until(gen, lambda c: isinstance(c, TokenChunk) and c.completion_tokens == 5))
    assert gen.cancel("queued") and gen.cancel("long") and not gen.cancel("nope")
    t0 = time.process_time()  # CPU time of this process: a loaded machine does not stretch it
    after = gen.step()
    # one step: the cancels end at once, no further decoding of them ("next" is accepted,
    # prefilled and decoded once in the same step: a few milliseconds on this model)
    assert time.process_time() - t0 < 0.5
    ends = {c.task_id: c for c in after if isinstance(c, FinishChunk)}
    assert ends["long"].finish_reason == "cancelled" and ends["long"].completion_tokens == 5
    assert ends["queued"].finish_reason == "cancelled"
    rest = run(gen)
    assert finish_of(rest, "next").finish_reason == "length"
    assert not any(c.task_id in ("long", "queued") for c in rest)


class CancellingTokenizer:
    """``loaded``'s tokenizer, but its chat template first runs ``hook`` (a cancel arriving
    from another thread while the engine prepares the request)."""

    def __init__(self, inner, hook) -> None:
        self.inner, self.hook = inner, hook

    def apply_chat_template(self, *args, **kwargs):
        self.hook()
        return self.inner.apply_chat_template(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_cancel_while_being_prepared_is_not_lost(loaded: LoadedModel) -> None:
    results: list[bool] = []
    tokenizer = CancellingTokenizer(loaded.tokenizer, lambda: results.append(gen.cancel("r")))
    gen = build_engine(dataclasses.replace(loaded, tokenizer=tokenizer))
    gen.submit(*req("r", "hello", max_tokens=50, temperature=0))
    chunks = run(gen)
    assert results == [True]
    assert finish_of(chunks, "r").finish_reason == "cancelled"
    assert not any(isinstance(c, (TokenChunk, PrefillProgressChunk)) for c in chunks)


@given(n=st.integers(0, 10_000), max_tokens=st.integers(-2, 10_000), ctx=st.integers(1, 9_000))
def test_context_rule(n: int, max_tokens: int, ctx: int) -> None:
    problem = validate_prompt(n, max_tokens, ctx)
    assert (problem is None) == (0 < n < ctx and max_tokens >= 1)
    assert (validate_prompt(n, None, ctx) is None) == (0 < n < ctx)  # no max_tokens: no limit
    if n >= ctx:
        assert problem == f"prompt is {n} tokens but the model's context is {ctx} tokens"


# -- a failed forward pass: the request on one rank, the runner on several ------------------


class FailingStage:
    """A stage that is not ``LocalStage`` (as a pipeline or tensor rank's) whose forward
    passes raise, as MLX's ring does when a ring socket fails mid-collective."""

    def prefill(self, model, tokens, cache):
        raise RuntimeError("[ring] Too many send/recv errors")

    next_token = next_tokens = prefill


class FailingLocal(LocalStage):
    def prefill(self, model, tokens, cache):
        raise RuntimeError("bad input")

    next_token = next_tokens = prefill


def test_a_failed_forward_fails_the_request_on_one_rank_and_the_stage_on_several(loaded: LoadedModel) -> None:
    """On one rank the request fails and the engine goes on; on a multi-rank stage a failed
    forward pass raises ``StageFailed`` out of ``step`` (the ranks are out of step for good:
    the runner fails, worker/runner/main.py)."""
    local = Engine(loaded, EngineSettings(prefill_chunk_size=16, max_batch=4), stage=FailingLocal())
    local.submit(*req("a", "hello"))
    local.submit(*req("b", "hello"))
    chunks = run(local)
    assert [c.task_id for c in chunks if isinstance(c, ErrorChunk)] == ["a", "b"]
    assert "bad input" in chunks[-1].error.message and not local.has_work()
    ring = Engine(loaded, EngineSettings(prefill_chunk_size=16, max_batch=4), stage=FailingStage())
    ring.submit(*req("a", "hello"))
    with pytest.raises(StageFailed, match="send/recv errors"):
        for _ in range(10):
            ring.step()
