"""Continuous batching: the generator's batch path on the tiny synthetic model,
in process and across two pipeline runner ranks.

Every request of a batch must produce exactly the tokens it produces alone (greedy and
seeded sampling alike), a cancelled sequence leaves at once and frees its KV rows, and the
batch never exceeds ``max_batch``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.support.models.synthetic_models import make_synthetic_model  # noqa: E402
from exo_p2p.types.chunks import ErrorChunk, FinishChunk, TokenChunk  # noqa: E402
from exo_p2p.types.engine import EngineSettings  # noqa: E402
from exo_p2p.types.tasks import ChatMessage, GenerationParams  # noqa: E402
from worker.engine.builder import build_engine  # noqa: E402
from worker.engine.scheduler import Engine  # noqa: E402
from worker.engine.loading.loader import LoadedModel, load_all  # noqa: E402
from worker.engine.pipeline import LocalStage  # noqa: E402
from tests.support.batch_drive import CHUNK, PROMPTS, Request, drive, requests, user
from tests.support.runners import tensor_runners


def engine(loaded: LoadedModel, max_batch: int, **kw) -> Engine:
    return build_engine(loaded, EngineSettings(prefill_chunk_size=CHUNK, max_batch=max_batch, **kw))


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_all(make_synthetic_model(tmp_path_factory.mktemp("batch") / "synthetic", n_layers=4))


def watch_tokens(gen: Engine) -> dict[str, list[int]]:
    """The token ids ``gen`` samples from now on, per task (pass them to ``drive``)."""
    ids: dict[str, list[int]] = {}
    gen.on_token = lambda t, tok: ids.setdefault(t, []).append(tok)
    return ids


@pytest.fixture(scope="module")
def solo(loaded: LoadedModel) -> dict[str, dict[str, Any]]:
    """Each request alone (``max_batch`` 1)."""
    out = {}
    for task_id, params in requests():
        gen = engine(loaded, 1)
        gen.submit(task_id, params)
        out[task_id] = drive(gen)
    return out


def test_batch_equals_solo_token_for_token(loaded: LoadedModel, solo: dict[str, dict[str, Any]]) -> None:
    """12 concurrent requests in one batch: each one's tokens, text and finish equal its
    solo run's, and the batch really held several sequences at once."""
    import mlx.core as mx

    gen = engine(loaded, 16)
    mx.clear_cache()
    idle = mx.get_active_memory()
    for req in requests():
        gen.submit(*req)
    got = drive(gen)
    mx.clear_cache()
    assert mx.get_active_memory() <= idle + 64 * 1024  # KV freed: back to idle (slack: sampler keys)
    assert got["largest"] >= 4
    for task_id, alone in solo.items():
        assert got["ids"][task_id] == alone["ids"][task_id], task_id
        assert got["texts"].get(task_id, "") == alone["texts"].get(task_id, ""), task_id
        assert got["finish"][task_id] == alone["finish"][task_id], task_id
    assert any(f[0] == "stop" for f in got["finish"].values())  # a stop string ended one
    assert not gen.batch.holds_kv and gen.batch_size == 0  # every KV row freed


def test_cancelled_row_leaves_and_others_are_unchanged(loaded: LoadedModel, solo: dict[str, dict[str, Any]]) -> None:
    """A sequence cancelled midway ends Cancelled at the next step; the rows around it
    still equal their solo runs."""
    gen = engine(loaded, 16)
    for req in requests():
        gen.submit(*req)
    got = drive(gen, cancel_after={"t10": 5})
    reason, n = got["finish"]["t10"]
    assert reason == "cancelled" and 5 <= n < 8 + 5 * 10
    for task_id, alone in solo.items():
        if task_id != "t10":
            assert got["ids"][task_id] == alone["ids"][task_id], task_id
    assert not gen.batch.holds_kv and gen.batch_size == 0


class PrefillWatch(LocalStage):
    """The whole model, noting how many prompts each prefill forward pass fed (``tokens [B, L]``)."""

    def __init__(self) -> None:
        super().__init__()
        self.widths: list[int] = []

    def prefill(self, model, tokens, cache) -> None:  # type: ignore[no-untyped-def]
        self.widths.append(int(tokens.shape[0]))
        super().prefill(model, tokens, cache)


def test_prompts_accepted_together_are_prefilled_together(loaded: LoadedModel, solo: dict[str, dict[str, Any]]) -> None:
    """12 requests queued at once are prefilled as one group (one forward pass a chunk for all
    their prompts, the shorter ones padded); the rows whose prompts end first join the batch at
    once; one cancelled while the group prefills leaves it at once with no token, and every
    other request still equals its solo run."""
    watch = PrefillWatch()
    gen = build_engine(loaded, EngineSettings(prefill_chunk_size=CHUNK, max_batch=16), stage=watch)
    for req in requests():
        gen.submit(*req)
    early = watch_tokens(gen)
    gen.step()  # the group's first chunk: t2's long prompt needs several more
    assert gen.prefilling is not None and len(gen.prefilling.task_ids) == 12
    gen.step()  # the shortest prompts (22 tokens) end: they go ahead
    assert "t2" in gen.prefilling.task_ids and gen.batch.rows
    assert len(gen.prefilling.task_ids) + len(gen.batch.rows) == 12
    assert gen.cancel("t2")
    got = drive(gen, ids=early)
    assert max(watch.widths) == 12
    assert got["finish"]["t2"] == ("cancelled", 0) and "t2" not in got["ids"]
    for task_id, alone in solo.items():
        if task_id != "t2":
            assert got["ids"][task_id] == alone["ids"][task_id], task_id
            assert got["finish"][task_id] == alone["finish"][task_id], task_id
    assert not gen.batch.holds_kv and gen.batch_size == 0


def test_short_prompts_do_not_wait_for_a_long_one(loaded: LoadedModel, solo: dict[str, dict[str, Any]]) -> None:
    """A group of prompts of 2–3 chunks of 16 tokens and one of 10 (t2): the short ones take
    their first tokens as their prompts end and decode while t2 still prefills (as a
    conversation's next turn, mostly cached, beside another's first turn), t2 joins them
    later, and every output equals its solo run."""
    gen = engine(loaded, 16)
    for req in requests(4):
        gen.submit(*req)
    early = watch_tokens(gen)
    firsts: dict[str, int] = {}
    for step in range(1, 4):
        for chunk in gen.step():
            if isinstance(chunk, TokenChunk):
                firsts.setdefault(chunk.task_id, step)
    assert gen.prefilling is not None and gen.prefilling.task_ids == ["t2"]  # still prefilling
    assert firsts == {"t0": 2, "t1": 3, "t3": 3}  # 22, 37, 45 prompt tokens
    got = drive(gen, ids=early)
    for task_id in ("t0", "t1", "t2", "t3"):
        assert got["ids"][task_id] == solo[task_id]["ids"][task_id], task_id
        assert got["finish"][task_id] == solo[task_id]["finish"][task_id], task_id


@pytest.mark.parametrize("first", [["t2"], ["t2", "t6"]])
def test_a_request_arriving_during_a_long_prefill_joins_it(loaded: LoadedModel, solo: dict[str, dict[str, Any]],
                                                           first: list[str]) -> None:
    """t0 (22 prompt tokens) submitted while a group prefills t2's 159 tokens (alone: the path
    of a lone request; or beside t6: a merged group cache) joins that group at its next chunk
    (``PrefillGroup.add``) and has its first token two chunks later, long before t2's; every
    output equals its solo run."""
    gen = engine(loaded, 16)
    by_id = dict(requests())
    for task_id in first:
        gen.submit(task_id, by_id[task_id])
    early = watch_tokens(gen)
    gen.step()
    gen.step()
    gen.submit("t0", by_id["t0"])
    gen.step()
    assert gen.prefilling is not None and gen.prefilling.task_ids == [*first, "t0"]
    gen.step()
    assert gen.prefilling.task_ids == first and [row.task_id for row in gen.batch.rows] == ["t0"]
    assert len(early["t0"]) >= 1 and not any(t in early for t in first)
    got = drive(gen, ids=early)
    for task_id in [*first, "t0"]:
        assert got["ids"][task_id] == solo[task_id]["ids"][task_id], task_id
        assert got["finish"][task_id] == solo[task_id]["finish"][task_id], task_id


def test_batch_never_exceeds_its_limit(loaded: LoadedModel, solo: dict[str, dict[str, Any]]) -> None:
    gen = engine(loaded, 3)
    for req in requests():
        gen.submit(*req)
    got = drive(gen)
    assert got["largest"] == 3
    assert all(got["ids"][t] == solo[t]["ids"][t] for t in solo)


@pytest.mark.integration
@pytest.mark.parametrize("sharding", ["pipeline", "tensor", "pipeline-micro"])
def test_runner_ranks_batch(loaded: LoadedModel, solo: dict[str, dict[str, Any]], sharding: str) -> None:
    """Two pipeline (or tensor) runner ranks with --max-batch 16 (``pipeline-micro``: the
    batch split in 2 micro-batches, ``worker/engine/micro.py``): 12 concurrent tasks delivered in
    different orders; one cancelled on rank 1 only once it streams. Every other task's text
    equals its solo text; the cancelled one ends Cancelled on both ranks within 5 s (more if this
    run decodes slowly: ``tests.support.runners.cancel_bound``)."""
    from exo_p2p.types.tasks import CancelTask
    from tests.support.runners import bring_up, cancel_bound, shut_down_cleanly, start_runners, task_for_request, wait_for

    tasks = [task_for_request(i, r) for i, r in enumerate(requests())]
    if sharding == "tensor":
        runners = tensor_runners(loaded.model_dir, 16)
    else:
        runners = start_runners(loaded.model_dir, 2, max_batch=16, micro_batches=2 if sharding == "pipeline-micro" else 0)
    try:
        bring_up(runners)
        for t in tasks:
            runners[0].send(t)
        for t in reversed(tasks):
            runners[1].send(t)
        bound = cancel_bound(runners[0], "t10", tokens=4)  # 5 s, or more if this run decodes slowly
        runners[1].send(CancelTask(runner_id="x", task_id="t10"))
        wait_for(lambda: all("cancelled" in r.task_status("t10") for r in runners), bound, "t10 cancelled on both")
        for t in tasks:
            if t.task_id != "t10":
                wait_for(lambda t=t: all("complete" in r.task_status(t.task_id) for r in runners), 60, f"{t.task_id} complete")
        for t in tasks:
            if t.task_id == "t10":
                continue
            text = "".join(c.text for c in runners[0].chunks(t.task_id) if isinstance(c, TokenChunk))
            assert text == solo[t.task_id]["texts"].get(t.task_id, ""), t.task_id
        shut_down_cleanly(runners)
    finally:
        for r in runners:
            r.close()


def test_master_picks_the_least_loaded_instance_by_batch_limit() -> None:
    """Load is unfinished tasks ÷ the instance's batch limit: an instance batching 16 with 3
    tasks in flight (3/16) takes the next request before one serving 1 at a time with 1
    (1/1), which the old fewest-tasks rule would have picked."""
    import msgspec

    from exo_p2p.types import (InstanceCreated, RankSettings, RunnerReady, RunnerStatusUpdated, SubmitTask,
                               TaskCreated)
    from master.commands import handle_command, instance_load
    from tests.support.rules.memory_pipeline import CARD8, GIB, _cluster, _params, _pipeline, _run

    batched = msgspec.structs.replace(_pipeline(CARD8, [], ["a"]), instance_id="b-batched",
                                      settings=RankSettings(prefill_chunk_size=32, max_batch=16))
    single = msgspec.structs.replace(_pipeline(CARD8, [], ["b"]), instance_id="a-single",
                                     settings=RankSettings(prefill_chunk_size=32, max_batch=1))
    state = _cluster(CARD8, {"a": 8 * GIB, "b": 8 * GIB}, batched)
    state = _run(state, [InstanceCreated(single), RunnerStatusUpdated("r0", "a-single", "b", RunnerReady())])

    def submit(task_id: str):
        nonlocal state
        d = handle_command(state, SubmitTask.generation("c", task_id, "m", _params("hi"), "a"))
        assert d.result.error is None and isinstance(d.events[0], TaskCreated)
        state = _run(state, d.events)
        return d.events[0].task.instance_id

    assert submit("t0") == "a-single"  # both empty: ties by instance id
    assert [submit(f"t{i}") for i in range(1, 4)] == ["b-batched"] * 3
    assert instance_load(state, batched) == 3 / 16 and instance_load(state, single) == 1.0
    assert submit("t4") == "b-batched"


# --- batch bookkeeping across simulated ranks ---------------------------------------------

_schedules = st.lists(
    st.tuples(
        st.lists(st.integers(0, 8), min_size=2, max_size=2),  # delivery tick on rank 0, 1
        st.integers(2, 10),  # max_tokens
        st.one_of(st.none(), st.tuples(st.integers(0, 1), st.integers(0, 30))),  # cancel: rank, tick
        st.sampled_from(range(len(PROMPTS) + 1)),  # the last: LONG_PROMPT
    ),
    min_size=1, max_size=6,
)
LONG_PROMPT = "the long story goes on and on, " * 18  # ~380 tokens: fits a capacity of 700 alone
"""A prompt several times as long as the others: left out of their group for its length."""


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schedule=_schedules, capacity=st.sampled_from([None, 700, 1400]))
def test_ranks_never_disagree_on_batch_rows(loaded: LoadedModel, schedule, capacity) -> None:
    """Two simulated ranks (a generator each, ``max_batch`` 3, the runner's round rule and a
    simulated all-gather): tasks of two clients reach the ranks at different ticks, cancels
    reach one rank only, a long prompt may be left out of the group for its length, and with
    a KV capacity some wait for memory. After every step both ranks hold the same rows in the
    same order, the same prefilling group, paused rows and queue, and every task ends the
    same way on both."""
    import numpy as np

    from worker.engine.agreement import TaskAgreement, encode_row

    world = 2
    gens = [Engine(loaded, EngineSettings(prefill_chunk_size=CHUNK, max_batch=3), kv_capacity_tokens=capacity)
            for _ in range(world)]
    deals: list[TaskAgreement[Request]] = [TaskAgreement() for _ in range(world)]
    ended: list[dict[str, str]] = [{} for _ in range(world)]
    texts = [*PROMPTS, LONG_PROMPT]
    reqs = [(f"s{i}", GenerationParams(messages=user(texts[p]), max_tokens=n, temperature=0.0, client=f"c{i % 2}"))
            for i, (_, n, _, p) in enumerate(schedule)]
    check_every, since_round = 2, 0
    for tick in range(2_000):
        for i, (ticks, _, cancel, _) in enumerate(schedule):
            for r in range(world):
                if ticks[r] == tick and not deals[r].add(reqs[i][0], i, reqs[i]):
                    assert deals[r].was_cancelled(reqs[i][0])  # the runner ends it Cancelled
                    ended[r][reqs[i][0]] = "cancelled"
            if cancel is not None and cancel[1] == tick:
                deals[cancel[0]].want_cancel(reqs[i][0])
        wants = [not g.has_work() or g.in_prefill or since_round >= check_every for g in gens]
        assert len(set(wants)) == 1  # a collective: every rank reaches it at the same point
        if wants[0]:
            rows = np.stack([encode_row(d.view()) for d in deals])
            for r in range(world):
                result = deals[r].round(lambda row: rows)
                for req in result.start:
                    gens[r].submit(*req)
                for task_id in result.cancel:
                    gens[r].cancel(task_id)
                for req in result.dropped:
                    ended[r][req[0]] = "cancelled"
            since_round = 0
        busy = [g.has_work() for g in gens]
        assert len(set(busy)) == 1
        if busy[0]:
            for r in range(world):
                for chunk in gens[r].step():
                    if isinstance(chunk, (FinishChunk, ErrorChunk)):
                        deals[r].finished(chunk.task_id)
                        ended[r][chunk.task_id] = getattr(chunk, "finish_reason", "error")
            since_round += 1
        seen = [([row.task_id for row in g.batch.rows], None if g.prefilling is None else g.prefilling.task_ids,
                 [s.task_id for s in g.slots.paused], g.slots.left_out, g.queued_task_ids) for g in gens]
        assert seen[0] == seen[1], seen
        if tick > 40 and all(len(e) == len(reqs) for e in ended):
            break
    else:
        raise AssertionError(f"tasks did not all end: {ended}")
    assert ended[0] == ended[1]
    for i, (_, _, cancel, _) in enumerate(schedule):
        if cancel is None:
            assert ended[0][f"s{i}"] == "length" or ended[0][f"s{i}"] == "stop"


# --- the prompt cache ------------------------------------------------------------------------

def test_second_turn_prefills_only_the_new_tokens(loaded: LoadedModel) -> None:
    """With the prompt cache, the second turn of a conversation feeds only the tokens after
    the longest cached prefix (asserted exactly) and answers as it does without the cache."""
    first = [{"role": "user", "content": PROMPTS[2]}]

    def turn(gen: Engine, task_id: str, messages) -> tuple[list[int], int]:
        before = gen.prefilled_tokens
        gen.submit(task_id, GenerationParams(messages=tuple(ChatMessage(**m) for m in messages), max_tokens=12,
                                             temperature=0.0))
        got = drive(gen)
        return got["ids"][task_id], gen.prefilled_tokens - before, got["texts"].get(task_id, "")

    cold = engine(loaded, 4)
    warm = engine(loaded, 4, prompt_cache_bytes=64 * 2**20)
    ids1, n1, text1 = turn(cold, "c1", first)
    ids1w, n1w, _ = turn(warm, "w1", first)
    assert ids1w == ids1 and n1w == n1  # nothing cached yet
    assert warm.prompt_cache.nbytes > 0 and len(warm.prompt_cache.entries) == 1
    second = [*first, {"role": "assistant", "content": text1}, {"role": "user", "content": "and then?"}]
    prompt2 = loaded.tokenizer.apply_chat_template(second, add_generation_prompt=True)
    prompt1 = loaded.tokenizer.apply_chat_template(first, add_generation_prompt=True)
    # the first turn's KV: its prompt and every token fed after it — the last sampled one too,
    # unless it ended the turn at max_tokens (then no step fed it)
    cached = list(warm.prompt_cache.entries[0].tokens)
    assert cached == prompt1 + ids1[: len(cached) - len(prompt1)] and len(cached) >= len(prompt1) + len(ids1) - 1
    common = next((i for i, (a, b) in enumerate(zip(cached, prompt2)) if a != b), min(len(cached), len(prompt2)))
    assert common >= len(prompt1)
    ids2, n2, _ = turn(cold, "c2", second)
    ids2w, n2w, _ = turn(warm, "w2", second)
    assert n2 == len(prompt2)
    assert n2w == len(prompt2) - min(common, len(prompt2) - 1)
    assert n2w < n2 and ids2w == ids2
