"""Memory-checked joins of the continuous batch: the rule (``worker.engine.batch_memory``) against mlx-lm's
real left-padded ``BatchKVCache``, and the engine holding to it.

- the bound ``peak_batch_tokens`` is never exceeded by the real cache's buffers, whatever the
  joins and the (early) leaves;
- ``join_verdict`` is consistent: "join" keeps the batch within capacity, "never" exactly
  when a sequence does not fit alone, more capacity never turns a join into a wait;
- an engine with a small KV capacity keeps every request's output equal to its solo run,
  never holds more KV than the capacity, lets a request wait rather than join, and refuses
  one that can never fit with the 503 ``out_of_memory`` at once.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from worker.engine.batch_memory import (  # noqa: E402
    KV_STEP,
    RowKV,
    capacity_tokens,
    join_verdict,
    model_kv_bytes_per_token,
    peak_batch_tokens,
)

_rows = st.lists(st.builds(RowKV, st.integers(1, 700), st.integers(0, 700)), max_size=6)


@settings(max_examples=200, deadline=None)
@given(batch=_rows, candidate=st.builds(RowKV, st.integers(1, 700), st.integers(0, 700)),
       capacity=st.integers(0, 20_000), more=st.integers(0, 20_000))
def test_join_verdict_is_consistent(batch, candidate, capacity, more) -> None:
    verdict = join_verdict(candidate, batch, capacity)
    assert (verdict == "never") == (peak_batch_tokens([candidate]) > capacity)
    if verdict == "join":
        assert peak_batch_tokens([*batch, candidate]) <= capacity
    if verdict == "wait":
        assert peak_batch_tokens([*batch, candidate]) > capacity
    if verdict == "join":  # more memory never makes a fitting sequence wait
        assert join_verdict(candidate, batch, capacity + more) == "join"
    assert join_verdict(candidate, batch, None) == "join"
    assert peak_batch_tokens([*batch, candidate]) >= peak_batch_tokens(batch)  # a row never lowers it


# one simulated step: ("join", used, remaining, ends_after) or ("step",)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("join"), st.integers(1, 600), st.integers(0, 400), st.integers(0, 400)),
        st.tuples(st.just("step")),
    ),
    min_size=1, max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops)
def test_real_batch_cache_stays_within_the_bound(ops) -> None:
    """Rows join (a prefilled ``KVCache`` merged in, as ``DecodeBatch.join``), every
    step feeds each row one token, a row leaves when it ends (``filter``, as ``DecodeBatch.drop``),
    some before their budget. Whenever a row joins, the bound computed at that moment, from
    the rows' (used, remaining), is ≥ the real buffers' ``B × length`` until the next join."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache, KVCache

    batch: BatchKVCache | None = None
    rows: list[list[int]] = []  # [used, remaining, steps left before it ends]
    bound = 0

    def real() -> int:
        if batch is None or batch.keys is None:
            return 0
        return int(batch.keys.shape[0] * batch.keys.shape[2])

    for op in ops:
        if op[0] == "join":
            _, used, remaining, ends = op
            one = KVCache()
            one.update_and_fetch(mx.zeros((1, 1, used, 1)), mx.zeros((1, 1, used, 1)))
            row = BatchKVCache.merge([one])
            if batch is None:
                batch = row
            else:
                batch.extend(row)
            rows.append([used, remaining, min(ends, remaining)])
            bound = peak_batch_tokens([RowKV(u, r) for u, r, _ in rows])
        elif batch is not None and rows:
            n = len(rows)
            batch.update_and_fetch(mx.zeros((n, 1, 1, 1)), mx.zeros((n, 1, 1, 1)))
            for r in rows:
                r[0], r[1], r[2] = r[0] + 1, r[1] - 1, r[2] - 1
            keep = [i for i, r in enumerate(rows) if r[2] > 0]
            if not keep:
                batch, rows = None, []
            elif len(keep) < n:
                batch.filter(mx.array(keep, dtype=mx.int32))
                rows = [rows[i] for i in keep]
        assert real() <= bound, (real(), bound, rows)


def test_capacity_tokens() -> None:
    assert capacity_tokens(None, 0, 100) is None
    assert capacity_tokens(10_000, 2_000, 100) == 80
    assert capacity_tokens(1_000, 2_000, 100) == 0
    assert capacity_tokens(1_000, 0, 0) is None  # unknown layout: no check


# --- the engine -----------------------------------------------------------------------------

from exo_p2p.types.engine import EngineSettings  # noqa: E402
from exo_p2p.types.tasks import ChatMessage, GenerationParams  # noqa: E402
from tests.support.batch_drive import CHUNK, drive, requests  # noqa: E402
from worker.engine.builder import build_engine  # noqa: E402
from worker.engine.pipeline import LocalStage  # noqa: E402
from worker.engine.scheduler import Engine  # noqa: E402


def solo_engine(loaded) -> Engine:
    """One request at a time, no memory check."""
    return build_engine(loaded, EngineSettings(prefill_chunk_size=CHUNK, max_batch=1))


def huge_request(max_tokens: int) -> tuple[str, GenerationParams]:
    return "huge", GenerationParams(messages=(ChatMessage("user", "hi"),), max_tokens=max_tokens, temperature=0.0)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from tests.support.models.synthetic_models import make_synthetic_model
    from worker.engine.loading.loader import load_all

    return load_all(make_synthetic_model(tmp_path_factory.mktemp("batchmem") / "synthetic", n_layers=4))


def test_kv_bytes_per_token_matches_the_real_cache(loaded) -> None:
    import mlx.core as mx

    from worker.engine.forward import new_cache

    cache = new_cache(loaded.model)
    loaded.model(mx.array([[1, 2, 3]]), cache=cache)
    held = sum(c.keys[..., : c.offset, :].nbytes + c.values[..., : c.offset, :].nbytes for c in cache)
    assert model_kv_bytes_per_token(loaded.model) * 3 == held


def _kv_tokens(cache) -> int:
    """Tokens the real buffers of a batch cache hold: ``B × length`` of the first layer."""
    if not cache or cache[0].keys is None:
        return 0
    keys = cache[0].keys
    return int(keys.shape[0] * keys.shape[2])


class BufferWatch(LocalStage):
    """The whole model (``LocalStage``), watching the real KV buffers of the decode batch
    through the batch cache the engine hands its stage at each decode step: ``peak`` is the
    most tokens they held, before a step's forward (rows joined, rows left) or after it grew
    the cache; ``steps`` counts the decode steps seen."""

    def __init__(self) -> None:
        super().__init__()
        self.peak = 0
        self.steps = 0

    def next_tokens(self, model, tokens, cache, samplers):
        before = _kv_tokens(cache)
        out = super().next_tokens(model, tokens, cache, samplers)
        self.peak = max(self.peak, before, _kv_tokens(cache))
        self.steps += 1
        return out


def test_small_kv_capacity_makes_requests_wait_and_outputs_stay_solo(loaded) -> None:
    """Capacity for about three of the twelve requests at once: the batch never holds more
    KV than the capacity (the real buffers, every step), never more rows than fit, requests
    wait instead of joining, every output equals its solo run; a request that cannot fit
    alone ends at once with the 503 ``out_of_memory`` while the others still run."""
    reqs = requests()
    solo = {}
    for task_id, params in reqs:
        gen = solo_engine(loaded)
        gen.submit(task_id, params)
        solo[task_id] = drive(gen)
    capacity = 3 * (KV_STEP + 160)
    watch = BufferWatch()
    gen = Engine(loaded, EngineSettings(prefill_chunk_size=CHUNK, max_batch=16), kv_capacity_tokens=capacity, stage=watch)
    for req in reqs[:6]:
        gen.submit(*req)
    gen.submit(*huge_request(4 * capacity))
    for req in reqs[6:]:
        gen.submit(*req)
    ids: dict[str, list[int]] = {}
    gen.on_token = lambda t, tok: ids.setdefault(t, []).append(tok)
    finish: dict[str, object] = {}
    largest, waited, huge_at = 0, False, None
    from exo_p2p.types.chunks import ErrorChunk, FinishChunk

    for step in range(20_000):
        if not gen.has_work():
            break
        for chunk in gen.step():
            if isinstance(chunk, FinishChunk):
                finish[chunk.task_id] = chunk.finish_reason
            elif isinstance(chunk, ErrorChunk):
                finish[chunk.task_id] = chunk.error
                if chunk.task_id == "huge":
                    huge_at = len(finish)
        assert watch.peak <= capacity, (watch.peak, capacity)
        largest = max(largest, gen.batch_size)
        # the head is queued, checked, and not accepted though the batch has room: it waits for memory
        waited = waited or bool(gen.queued_task_ids and not gen.in_prefill and not gen.batch.full)
    else:
        raise AssertionError("engine still busy")
    assert watch.steps > 0 and watch.peak > 0  # the watch saw the real buffers
    assert waited  # someone waited for memory, not for the batch limit
    assert 2 <= largest < 12
    error = finish["huge"]
    assert error.status == 503 and error.code == "out_of_memory" and "KV cache" in error.message
    assert huge_at is not None and huge_at < len(reqs)  # at once, not after everything else
    for task_id, _ in reqs:
        assert ids[task_id] == solo[task_id]["ids"][task_id], task_id
        assert finish[task_id] == solo[task_id]["finish"][task_id][0]
    assert not gen.batch.holds_kv and gen.batch_size == 0


def test_a_waiting_request_can_be_cancelled(loaded) -> None:
    gen = Engine(loaded, EngineSettings(prefill_chunk_size=CHUNK, max_batch=16), kv_capacity_tokens=KV_STEP + 100)
    hello = GenerationParams(messages=(ChatMessage("user", "hello"),), max_tokens=60, temperature=0.0)
    gen.submit("a", hello)
    gen.submit("b", hello)
    from exo_p2p.types.chunks import FinishChunk

    ended: dict[str, str] = {}
    for _ in range(2_000):
        for chunk in gen.step():
            if isinstance(chunk, FinishChunk):
                ended[chunk.task_id] = chunk.finish_reason
        head = gen.queue.head()
        if len(gen.batch.rows) == 1 and gen.queued_task_ids == ["b"] and head is not None and head.prepared is not None:
            break
    head = gen.queue.head()
    assert gen.queued_task_ids == ["b"] and head is not None and head.prepared is not None  # waiting, checked
    assert not gen.in_prefill  # no agreement round every step while it waits
    assert gen.cancel("b")
    for _ in range(2_000):
        if not gen.has_work():
            break
        for chunk in gen.step():
            if isinstance(chunk, FinishChunk):
                ended[chunk.task_id] = chunk.finish_reason
    assert ended == {"a": "length", "b": "cancelled"}


@pytest.mark.integration
def test_pipeline_ranks_agree_on_the_smallest_capacity(loaded) -> None:
    """Two pipeline runner ranks whose KV budgets differ 100-fold: both use the smaller
    rank's capacity (agreed at warm-up), so joins are decided alike — every task's text
    equals its solo text on both ranks, and a request that cannot fit on rank 1 ends with the
    503 ``out_of_memory`` on both, though rank 0 alone would have taken it."""
    from exo_p2p.types.tasks import ConnectToGroup
    from exo_p2p.types.chunks import ErrorChunk, TokenChunk
    from tests.support.runners import RunnerProc, bring_up, make_instance, shut_down_cleanly, task_for_request, wait_for
    from worker.runner.protocol import RunnerSetup

    reqs = requests(6)
    solo = {}
    for task_id, params in reqs:
        gen = solo_engine(loaded)
        gen.submit(task_id, params)
        solo[task_id] = drive(gen)["texts"].get(task_id, "")
    half = model_kv_bytes_per_token(loaded.model) // 2  # each rank holds 2 of the 4 layers
    capacity = 2 * (KV_STEP + 160)
    budgets = [100 * capacity * half, capacity * half]
    instance = make_instance(loaded.model_dir, 2)
    runners = [RunnerProc(RunnerSetup(instance=instance, shard=s, model_dir=str(loaded.model_dir), heartbeat_interval=0.5,
                                      engine=EngineSettings(prefill_chunk_size=CHUNK, max_batch=16, kv_cache_bytes=budgets[s.rank])))
               for s in instance.shards]
    huge = huge_request(capacity)

    tasks = [task_for_request(i, r) for i, r in enumerate([*reqs[:3], huge, *reqs[3:]])]
    try:
        for r in runners:
            r.send(ConnectToGroup(runner_id="x"))
        bring_up(runners)
        for t in tasks:
            runners[0].send(t)
        for t in reversed(tasks):
            runners[1].send(t)
        for t in tasks:
            wait_for(lambda t=t: all(("complete" in r.task_status(t.task_id) or "failed" in r.task_status(t.task_id))
                                     for r in runners), 60, f"{t.task_id} ended")
        errors = [c for c in runners[0].chunks("huge") if isinstance(c, ErrorChunk)]  # rank 0 sends the chunks
        assert errors and errors[0].error.status == 503 and errors[0].error.code == "out_of_memory"
        assert all(r.task_status("huge")[-1] == "failed" for r in runners)
        for task_id, _ in reqs:
            text = "".join(c.text for c in runners[0].chunks(task_id) if isinstance(c, TokenChunk))
            assert text == solo[task_id], task_id
        shut_down_cleanly(runners)
    finally:
        for r in runners:
            r.close()


def test_a_batching_instance_agrees_four_times_as_often() -> None:
    """A request arriving while a batch decodes waits for the next agreement round to join,
    so a batching instance's rounds come ~0.25 s apart instead of ~1 s (same step bounds)."""
    from worker.runner.pace import MAX_CHECK_EVERY, check_every_for, round_seconds

    assert round_seconds(1) == 1.0 and round_seconds(16) == 0.25
    assert check_every_for(8.0, round_seconds(16)) == 2 < check_every_for(8.0, round_seconds(1)) == 8
    assert check_every_for(1000.0, round_seconds(16)) == MAX_CHECK_EVERY
    assert check_every_for(1.0, round_seconds(16)) == 1


def test_sample_rows_draws_plain_greedy_rows_with_one_argmax_alike() -> None:
    """``sample_rows``' shortcut (one ``argmax`` for plain greedy rows) draws what each row's
    own sampler draws: all plain greedy, and mixed with seeded and penalised rows."""
    import mlx.core as mx

    from worker.engine.pipeline import sample_rows
    from worker.engine.sampling import Sampler

    logits = mx.random.normal((5, 50), key=mx.random.key(3))
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)

    def make(kind: str, i: int) -> Sampler:
        if kind == "greedy":
            return Sampler(GenerationParams(messages=(), temperature=0.0, top_p=1.0), i)
        if kind == "penalty":
            return Sampler(GenerationParams(messages=(), temperature=0.0, top_p=1.0, repetition_penalty=1.5), i,
                           prompt=[int(mx.argmax(logprobs[i]).item())])
        return Sampler(GenerationParams(messages=(), temperature=0.9, top_p=1.0), 100 + i, prompt=[1, 2, 3])

    for kinds in (["greedy"] * 5, ["greedy", "seeded", "greedy", "penalty", "seeded"]):
        batch = sample_rows([make(k, i) for i, k in enumerate(kinds)], logprobs).tolist()
        alone = [make(k, i)(logprobs[i : i + 1]).item() for i, k in enumerate(kinds)]
        assert batch == alone, kinds
    assert make("greedy", 0).plain_greedy and not make("penalty", 1).plain_greedy and not make("seeded", 2).plain_greedy
