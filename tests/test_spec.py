"""Speculative decoding (prompt-lookup drafts verified in the batch): its pure rules, the
per-row KV rollback, and the engine's greedy output with speculation on equal, token for
token, to its output with speculation off — in a batch of 16 mixed rows (sampled,
penalised, stop strings, regex- and JSON-schema-constrained, tools), with stop strings and
``max_tokens`` landing on the exact token, and with a cancel.

The tiny random model never repeats itself, so drafts would all be rejected; the "echoing"
models scale the layers' residual contributions down (``echo``): their greedy output repeats
spans of what came before, so drafts are partly (0.15) or wholly (0) accepted, and the tests
check both kinds of rows were verified.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from tests.support.batch_drive import drive, requests, user
from tests.support.models.synthetic_models import make_synthetic_model
from exo_p2p.types.engine import EngineSettings
from exo_p2p.types.tasks import GenerationParams, OutputFormat
from worker.engine.builder import build_engine
from worker.engine.loading.loader import LoadedModel, load_all
from worker.engine.spec.ngram import NgramIndex
from worker.engine.spec.policy import BACKOFF, WINDOW, DraftPolicy
from worker.engine.spec.rollback import rollback
from worker.engine.spec.verify import accepted_count


def test_ngram_proposes_the_latest_longest_match() -> None:
    assert NgramIndex([1, 2, 3, 4, 5, 9, 2, 3, 4, 6, 7, 8, 3, 4]).propose(3) == []  # tail "8 3 4" never seen before
    index = NgramIndex([1, 2, 3, 4, 5, 9, 2, 3, 4, 6, 7, 8, 2, 3, 4])
    assert index.propose(3) == [6, 7, 8]  # "2 3 4": its latest earlier occurrence is followed by 6 7 8
    assert index.propose(1) == [6]
    assert index.propose(0) == []
    index.extend([6, 7])
    assert index.propose(16) == [8, 2, 3, 4, 6, 7]  # tail "4 6 7"; never past the history's end
    assert NgramIndex([1, 2, 3, 4]).propose(4) == []  # no earlier occurrence
    assert NgramIndex([5, 5, 5, 5]).propose(4) == [5]


def test_ngram_prefers_longer_tails() -> None:
    # "2 3 4" was last followed by 9, but "1 2 3 4" by 5: the longer tail wins
    index = NgramIndex([1, 2, 3, 4, 5, 0, 2, 3, 4, 9, 7, 1, 2, 3, 4])
    assert index.propose(1) == [5]


def test_ngram_copies_the_block_that_matches_furthest_back() -> None:
    # a "file" of near-identical blocks [9, 8, i, 7, 6] (i = 1 … 4); the output rewrote block 1 with
    # its number renamed (1 -> 5) and block 2 as it was: after "… 7 6 9 8" the latest occurrence of the
    # tail is the output's own block 2 (followed by 2), but the prompt's block 3 matches the whole
    # tail back through block 2, so its number comes next, and the copy goes on from there
    prompt = [b for i in (1, 2, 3, 4) for b in (9, 8, i, 7, 6)]
    index = NgramIndex(prompt)
    index.extend([9, 8, 5, 7, 6, 9, 8, 2, 7, 6, 9, 8])
    assert index.propose(4) == [3, 7, 6, 9]
    index.extend([3, 7, 6, 9, 8])
    assert index.propose(8) == [4, 7, 6, 9, 8, 5, 7, 6]  # the copied span goes on (the history is one sequence)


def test_ngram_prefers_the_prompt_and_the_copied_span_when_tied() -> None:
    index = NgramIndex([1, 2, 3, 4, 5, 6])  # the prompt: 1 2 3 followed by 4
    index.extend([0, 1, 2, 3, 7, 8, 0, 1, 2, 3])  # the output: 0 1 2 3 followed by 7 once
    # the output's "0 1 2 3" matches 4 tokens back against the prompt's 3: the output wins
    assert index.propose(2) == [7, 8]
    index = NgramIndex([1, 2, 3, 4, 5, 6])
    index.extend([9, 1, 2, 3, 7, 8, 0, 1, 2, 3])  # "1 2 3" matches 3 back in prompt and output alike
    assert index.propose(2) == [4, 5]  # tied: the prompt's


def test_ngram_keeps_copying_the_span_it_copied() -> None:
    # the prompt holds a 40-token span S twice, after different openings and followed by 1 and
    # by 2; the output copies the first (its opening matched): once the tail agrees with both
    # copies for all MAX_MATCH tokens, the copy pointer keeps the first, where the latest would
    # be the second
    span = list(range(10, 50))
    index = NgramIndex([100, 101, *span, 1, 200, 201, *span, 2])
    index.extend([100, 101, 10, 11, 12])
    assert index.propose(4) == [13, 14, 15, 16]  # "100 101 10 11 12" matches the first copy further back
    index.extend(span[3:35])
    assert index.propose(8) == [45, 46, 47, 48, 49, 1, 200, 201]


def test_ngram_says_before_the_next_token_whether_a_match_is_possible() -> None:
    index = NgramIndex([1, 2, 3, 4, 5])
    assert not index.may_propose()  # "4 5" never began an indexed 3-gram: no next token can match
    index.extend([1, 2])
    assert index.may_propose()  # "1 2" began "1 2 3"
    index.extend([3])
    assert index.propose(2) == [4, 5]
    assert not NgramIndex([7]).may_propose()


def test_accepted_count_is_the_exact_match_prefix() -> None:
    assert accepted_count([5, 6, 7], [5, 6, 8, 1]) == 2
    assert accepted_count([5, 6, 7], [4, 6, 7, 1]) == 0
    assert accepted_count([5, 6, 7], [5, 6, 7, 1]) == 3
    assert accepted_count([], [3]) == 0


def test_policy_adapts_k_and_pauses_on_low_acceptance() -> None:
    policy = DraftPolicy(8)
    assert policy.wanted() == 2
    policy.record(2, 2)
    assert policy.wanted() == 4
    policy.record(4, 4)
    policy.record(6, 6)
    assert policy.wanted() == 8  # at most max_k
    policy.record(8, 0)
    assert policy.wanted() == 4
    policy = DraftPolicy(8)
    for _ in range(WINDOW):  # a window of mostly rejected drafts
        policy.record(1, 0)
    assert [policy.wanted() for _ in range(BACKOFF)] == [0] * BACKOFF
    assert policy.wanted() == 2  # tries again
    for _ in range(WINDOW):
        policy.record(1, 0)
    assert sum(policy.wanted() == 0 for _ in range(2 * BACKOFF)) == 2 * BACKOFF  # backoff doubled
    with pytest.raises(ValueError):
        DraftPolicy(0)
    policy = DraftPolicy(8)
    policy.record(2, 2)
    for _ in range(WINDOW - 2):  # look-ups that found nothing: k kept, the window judged low
        policy.miss()
    assert [policy.wanted() for _ in range(BACKOFF)] == [0] * BACKOFF


def _batch_cache(lengths: list[int], fed: int) -> tuple[Any, list[mx.array]]:
    """A left-padded batch cache of rows of ``lengths`` tokens, then ``fed`` more for every
    row; the keys each row was given, in order."""
    from mlx_lm.models.cache import BatchKVCache

    longest = max(lengths)
    cache = BatchKVCache([longest - n for n in lengths])
    keys = mx.random.normal((len(lengths), 2, longest + fed, 4), key=mx.random.key(1))
    cache.update_and_fetch(keys[:, :, :longest], keys[:, :, :longest])
    cache.update_and_fetch(keys[:, :, longest:], keys[:, :, longest:])
    rows = [keys[i, :, longest - n :] for i, n in enumerate(lengths)]
    return cache, rows


def test_rollback_drops_each_rows_own_positions() -> None:
    cache, rows = _batch_cache([5, 3, 7], fed=4)
    drop = [1, 4, 2]
    rollback([cache], drop)
    for i, d in enumerate(drop):
        kept = rows[i][:, : rows[i].shape[1] - d]
        got = cache.extract(i)
        assert got.offset == kept.shape[1]
        assert mx.array_equal(got.keys[0], kept).item()
    assert cache.offset.tolist() == [r.shape[1] - d for r, d in zip(rows, drop)]
    with pytest.raises(ValueError):
        rollback([cache], [1, 1])
    with pytest.raises(ValueError):
        rollback([cache], [-1, 0, 0])


def echo(loaded: LoadedModel, factor: float) -> LoadedModel:
    """``loaded`` with its layers' residual contributions scaled by ``factor`` (in place)."""
    for layer in loaded.model.model.layers:
        layer.self_attn.o_proj.weight = layer.self_attn.o_proj.weight * factor
        layer.mlp.down_proj.weight = layer.mlp.down_proj.weight * factor
    return loaded


@pytest.fixture(scope="module")
def partly(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return echo(load_all(make_synthetic_model(tmp_path_factory.mktemp("spec") / "m", n_layers=4)), 0.15)


@pytest.fixture(scope="module")
def wholly(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return echo(load_all(make_synthetic_model(tmp_path_factory.mktemp("spec0") / "m", n_layers=2)), 0.0)


def serve(loaded: LoadedModel, reqs: list[tuple[str, GenerationParams]], speculative: str, max_batch: int = 16,
          max_positions: int | None = None, **kw: Any) -> tuple[dict[str, Any], Any]:
    gen = build_engine(loaded, EngineSettings(prefill_chunk_size=16, max_batch=max_batch, speculative=speculative))
    if max_positions is not None and gen.batch.spec is not None:
        gen.batch.spec.max_positions = max_positions  # let a wide batch draft (the default keeps 16 rows from it)
    for task_id, params in reqs:
        gen.submit(task_id, params)
    return drive(gen, **kw), gen.batch.spec


SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "string", "maxLength": 12}}, "required": ["a"]})
TOOLS = json.dumps([{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}])


def mixed() -> list[tuple[str, GenerationParams]]:
    """16 rows: the batch tests' mix (sampled, stop strings, regex), plus greedy rows that
    draft, a JSON-schema row, a tools row and an opted-out one."""
    rows = requests(10)
    for i in range(3):
        rows.append((f"echo{i}", GenerationParams(messages=user(f"a b c {i} a b c {i} " * (i + 2)), max_tokens=40 + 9 * i,
                                                  temperature=0.0)))
    rows.append(("json", GenerationParams(messages=user("give json"), max_tokens=30, temperature=0.0,
                                          output_format=OutputFormat("json_schema", SCHEMA))))
    rows.append(("tools", GenerationParams(messages=user("time?"), max_tokens=30, temperature=0.0, tools=TOOLS)))
    rows.append(("optout", GenerationParams(messages=user("a b a b a b"), max_tokens=30, temperature=0.0,
                                            speculative=False)))
    return rows


def test_batch_of_16_mixed_rows_equal_with_speculation_off(partly: LoadedModel) -> None:
    off, _ = serve(partly, mixed(), "off")
    on, spec = serve(partly, mixed(), "ngram", max_positions=16 * 9)
    assert on["ids"] == off["ids"]
    assert on["texts"] == off["texts"]
    assert on["finish"] == off["finish"]
    assert off["largest"] == on["largest"] == 16
    assert 0 < spec.stats.accepted < spec.stats.proposed  # drafts accepted and rejected
    assert "optout" not in spec.stats.per_task and "json" not in spec.stats.per_task
    wide, _ = serve(partly, mixed(), "ngram")  # by default: no drafts until fewer than 16 rows are left
    assert wide["ids"] == off["ids"]


def test_whole_acceptance_many_tokens_a_step_and_max_tokens_exact(wholly: LoadedModel) -> None:
    reqs = [(f"r{i}", GenerationParams(messages=user(f"x y {i}"), max_tokens=23 + 7 * i, temperature=0.0)) for i in range(3)]
    off, _ = serve(wholly, reqs, "off")
    on, spec = serve(wholly, reqs, "ngram")
    assert on["ids"] == off["ids"] and on["finish"] == off["finish"]
    for i in range(3):
        assert len(on["ids"][f"r{i}"]) == 23 + 7 * i
    assert spec.stats.accepted == spec.stats.proposed > 0
    assert spec.stats.steps < sum(23 + 7 * i for i in range(3)) / 3  # several tokens a step


def test_seeded_sampled_rows_draft_and_keep_their_tokens(wholly: LoadedModel) -> None:
    """A sampled row's drafts are accepted by the rejection rule, which for a prompt-lookup
    draft draws each position as an ordinary step would (``spec/rejection.py``): seeded output
    is the same with speculation on and off, alone or in a batch."""
    reqs = [(f"s{i}", GenerationParams(messages=user(f"k {i}"), max_tokens=40, temperature=3.5, seed=i)) for i in range(6)]
    off, _ = serve(wholly, reqs, "off")
    on, spec = serve(wholly, reqs, "ngram", max_positions=6 * 9)
    alone, _ = serve(wholly, reqs[:1], "ngram")
    assert on["ids"] == off["ids"] and alone["ids"]["s0"] == off["ids"]["s0"]
    assert 0 < spec.stats.accepted < spec.stats.proposed


def test_stop_string_lands_on_the_exact_token(wholly: LoadedModel) -> None:
    base = GenerationParams(messages=user("q r s"), max_tokens=40, temperature=0.0)
    text = serve(wholly, [("t", base)], "off")[0]["texts"]["t"]
    stop = text[: 2 * len(text) // 3]  # the output stops once it reaches two thirds of itself
    assert len(stop) > 4
    params = GenerationParams(messages=base.messages, max_tokens=40, temperature=0.0, stop=(stop,))
    off, _ = serve(wholly, [("t", params)], "off")
    on, spec = serve(wholly, [("t", params)], "ngram")
    assert on["texts"] == off["texts"] and on["finish"] == off["finish"] and on["ids"] == off["ids"]
    assert off["finish"]["t"][0] == "stop" and off["finish"]["t"][1] < 40
    assert spec.stats.accepted > 0


def test_cancel_stops_within_a_step(wholly: LoadedModel) -> None:
    reqs = [("c", GenerationParams(messages=user("m n o"), max_tokens=200, temperature=0.0))]
    full, _ = serve(wholly, reqs, "off")
    on, _ = serve(wholly, reqs, "ngram", cancel_after={"c": 10})
    got = on["ids"]["c"]
    assert on["finish"]["c"][0] == "cancelled"
    assert 10 <= len(got) < 200 and got == full["ids"]["c"][: len(got)]


def test_settings_refuse_unknown_kinds() -> None:
    with pytest.raises(ValueError, match="speculative"):
        EngineSettings(speculative="draft").check()
    with pytest.raises(ValueError, match="num_draft"):
        EngineSettings(num_draft=0).check()


def test_acceptance_reaches_finish_records_and_top(wholly: LoadedModel) -> None:
    """A request's drafted and accepted tokens come in its ``FinishChunk``; ``exo-p2p top``
    shows an instance's acceptance from its rank-0 runner's counters."""
    from exo_p2p.cli.queries.top import acceptance_by_instance, parse_metrics
    from exo_p2p.types.chunks import FinishChunk

    gen = build_engine(wholly, EngineSettings(prefill_chunk_size=16, max_batch=2, speculative="ngram"))
    gen.submit("f", GenerationParams(messages=user("u v w"), max_tokens=30, temperature=0.0))
    finish = [c for _ in range(500) if gen.has_work() for c in gen.step() if isinstance(c, FinishChunk)]
    stats = gen.batch.spec.stats
    assert (finish[0].draft_proposed, finish[0].draft_accepted) == tuple(stats.per_task["f"]) == (stats.proposed, stats.accepted)
    assert finish[0].draft_accepted > 0
    text = ('exo_runner_draft_proposed_tokens_total{instance="i1",model="m",rank="0"} 40\n'
            'exo_runner_draft_accepted_tokens_total{instance="i1",model="m",rank="0"} 30\n'
            'exo_runner_draft_proposed_tokens_total{instance="i2",model="m",rank="0"} 0\n')
    assert acceptance_by_instance(parse_metrics(text)) == {"i1": "75%"}


def test_openai_chat_opts_a_request_out() -> None:
    import msgspec

    from exo_p2p.api.families.openai.chat import chat_params
    from exo_p2p.api.schemas import ChatCompletionRequest

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert chat_params(msgspec.convert(body, ChatCompletionRequest)).speculative is True
    assert chat_params(msgspec.convert({**body, "speculative": False}, ChatCompletionRequest)).speculative is False
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({**body, "speculative": "no"}, ChatCompletionRequest)


def _repeats(loaded: LoadedModel, speculative: str, seeds: range, positions: int = 8,
             temperature: float = 3.5) -> tuple[list[int], Any]:
    """Per seed, how many of a sampled request's first ``positions`` tokens repeat the one before
    (the echoing model at temperature 3.5: drafts propose repeats and about half are accepted,
    so a wrong acceptance rule moves this); and the drafting stats. One figure per request:
    independent samples. Seeded, so the outcome is fixed (no flakiness)."""
    reqs = [(f"s{seed}", GenerationParams(messages=user("a b c d a b c d a b c d a b"), max_tokens=positions,
                                          temperature=temperature, seed=seed)) for seed in seeds]
    got, spec = serve(loaded, reqs, speculative, max_batch=len(reqs), max_positions=len(reqs) * 9)
    counts = []
    for task, _ in reqs:
        ids = got["ids"][task][:positions]
        counts.append(sum(a == b for a, b in zip(ids, ids[1:])))
    return counts, spec


def test_sampled_rows_keep_their_distribution(wholly: LoadedModel) -> None:
    """Sampled rows draft and accept by the rejection rule: over 960 seeds each, the histogram
    of repeats among a request's first 8 tokens matches speculation off (chi-square
    contingency test, p > 0.001), while drafts were both accepted and rejected."""
    from collections import Counter

    from scipy.stats import chi2_contingency

    off: Counter[int] = Counter()
    on: Counter[int] = Counter()
    proposed = accepted = 0
    for start in range(0, 960, 96):
        off.update(_repeats(wholly, "off", range(30_000 + start, 30_000 + start + 96))[0])
        counts, spec = _repeats(wholly, "ngram", range(10_000 + start, 10_000 + start + 96))
        on.update(counts)
        proposed, accepted = proposed + spec.stats.proposed, accepted + spec.stats.accepted
    bins = sorted(k for k in off.keys() | on.keys() if off[k] + on[k] >= 10)
    table = [[c[k] for k in bins] for c in (off, on)]
    pvalue = chi2_contingency(table).pvalue
    assert 0.1 * proposed < accepted < 0.9 * proposed
    assert pvalue > 0.001
