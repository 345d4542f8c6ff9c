"""Quantized KV against full precision on a trained model: top-1 agreement over 2,000 greedy
tokens of 16 prompts (docs/architecture.md "Quantized KV cache").

The model is the embedded SmolLM2-135M-Instruct (30 layers, 3 KV heads of 64: the model a node
serves by default, and trained — a random synthetic model's near-flat logits would measure
ties, not the cache), its weights expanded to float32 as a CPU node holds them. The 16
prompts' reference answers (125 greedy tokens each, 2,000 in all) come from the engine at full
precision, a batch of 16. The quantized cache is then measured teacher-forced: the 16 rows
are prefilled into their own ``QuantizedKVCache`` and merged into one
``QuantizedBatchKVCache`` (left-padded, as the decode batch holds them), each step feeds every
row its reference token, and the quantized model's top-1 must be the reference's next token.
Teacher forcing measures the cache's error per token; free-running greedy output diverges
for good at the first disagreement, so it measures when, not how often (printed too).
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]  # 90 s alone, 13 min at load 20 (docs/testing.md)

PROMPTS = [
    "What is the capital of France?", "Write a haiku about the sea.", "Explain photosynthesis in two sentences.",
    "List three prime numbers.", "How do I reverse a list in Python?", "What is 17 times 23?",
    "Describe a cat to someone who has never seen one.", "Give me a recipe for pancakes.",
    "Why is the sky blue?", "Translate 'good morning' into Spanish.", "What causes the seasons on Earth?",
    "Write a short story opening about a robot.", "What is the difference between RAM and disk?",
    "Summarize the plot of Romeo and Juliet.", "How does a bicycle stay upright?", "Name the planets in order.",
]
NEW_TOKENS = 125  # × 16 prompts = 2,000 tokens
EOS = (0, 2)
"""SmolLM2's end tokens, kept from being chosen (the engine's ``logit_bias``, the same mask
here) so every answer runs its 125 tokens."""


def top1(logits: mx.array) -> list[int]:
    """Each row's most likely token but an end token (``logits [B, vocab]``)."""
    masked = logits.at[:, list(EOS)].add(-1e9)
    return [int(t) for t in mx.argmax(masked, axis=-1).tolist()]


def reference(loaded) -> dict[str, list[int]]:
    """Every prompt's greedy answer at full precision (the engine, one batch of 16)."""
    from exo_p2p.types.engine import EngineSettings
    from exo_p2p.types.tasks import ChatMessage, GenerationParams
    from tests.support.batch_drive import drive
    from worker.engine.builder import build_engine

    gen = build_engine(loaded, EngineSettings(max_batch=16, prompt_cache_bytes=0))
    for i, prompt in enumerate(PROMPTS):
        gen.submit(f"p{i}", GenerationParams(messages=(ChatMessage("user", prompt),), max_tokens=NEW_TOKENS,
                                             temperature=0.0, logit_bias=tuple((t, -100.0) for t in EOS)))
    return drive(gen)["ids"]


def teacher_forced(loaded, bits: int, answers: list[list[int]]) -> tuple[int, int, list[int]]:
    """(agreeing tokens, tokens, first disagreement per row) of the model with a ``bits`` KV
    cache fed the reference ``answers`` after their prompts."""
    from mlx_lm.models.cache import KVCache

    from worker.engine.kvq.layers import merge_rows, quantized

    model, prompts = loaded.model, [loaded.tokenizer.apply_chat_template([{"role": "user", "content": p}],
                                                                         add_generation_prompt=True) for p in PROMPTS]
    rows, firsts = [], []
    for prompt in prompts:
        cache = quantized([KVCache() for _ in model.layers], bits, 64)
        logits = model(mx.array(prompt)[None], cache=cache)
        firsts.append(top1(logits[:, -1])[0])
        rows.append(cache)
    batch = [merge_rows(list(layer)) for layer in zip(*rows)]
    agree, total, first_miss = 0, 0, [-1] * len(answers)
    for step in range(NEW_TOKENS):
        want = [a[step] for a in answers]
        got = firsts if step == 0 else top1(logits[:, -1])
        for i, (g, w) in enumerate(zip(got, want)):
            agree, total = agree + (g == w), total + 1
            if g != w and first_miss[i] < 0:
                first_miss[i] = step
        logits = model(mx.array(want)[:, None], cache=batch)
        mx.eval(logits)
    return agree, total, first_miss


def test_q8_top1_agreement_is_at_least_99_percent_over_2000_tokens(tmp_path: Path) -> None:
    from exo_p2p.models.gguf.importer import import_gguf
    from exo_p2p.models.stores.embedded import find_embedded_gguf
    from worker.engine.loading.loader import load_all

    loaded = load_all(import_gguf(find_embedded_gguf(), tmp_path / "smollm2"), weights_dtype="float32")
    ref = reference(loaded)
    answers = [ref[f"p{i}"] for i in range(len(PROMPTS))]
    assert all(len(a) == NEW_TOKENS for a in answers)
    full = teacher_forced(loaded, 0, answers)
    assert full[0] / full[1] >= 0.995  # the teacher-forced path itself reproduces the engine's answers
    results = {bits: teacher_forced(loaded, bits, answers) for bits in (8, 4)}
    for bits, (agree, total, first) in results.items():
        print(f"\nq{bits}: top-1 agreement {agree}/{total} = {agree / total:.2%} teacher-forced; "
              f"first disagreement per prompt (step, -1 none): {first}")
    print(f"full precision through the same path: {full[0]}/{full[1]}")
    agree, total, _ = results[8]
    assert total == 2000 and agree / total >= 0.99
