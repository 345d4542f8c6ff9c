"""Prefix-aware routing, pure: the digests of a request's prefixes (``exo_p2p.content.prefixes``),
the rule that picks an instance (``master.routing.choose``, with hypothesis properties), the
master's decision on a State with two ready instances, the log's bound on what an instance
publishes, who may publish it, the prompt cache's digests and the runner's publication gap.
Real nodes: ``scripts/bench_routing.py``."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exo_p2p.content.prefixes import MAX_DIGESTS, PER_ENTRY, bounded, entry_digests, longest_match, prefix_chain
from exo_p2p.types import (
    ChatMessage,
    GenerationParams,
    InstanceDeleted,
    InstancePrefixesUpdated,
    PlaceInstance,
    RankSettings,
    RunnerReady,
    RunnerStatusUpdated,
    SubmitTask,
    TaskCreated,
)
from master.commands import handle_command
from master.local_rules import refuse_local
from master.routing import Option, choose
from tests.support.rules.master_run import one_node, run
from worker.engine.prompt_cache import PromptCache
from worker.runner.stats import PrefixPublisher

pytestmark = pytest.mark.unit

_text = st.text(min_size=0, max_size=30)
_messages = st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), _text), min_size=1, max_size=8)


def conv(pairs) -> GenerationParams:
    return GenerationParams(tuple(ChatMessage(r, c) for r, c in pairs))


@given(_messages, _messages)
def test_a_longer_conversation_holds_every_digest_of_its_beginning(first, more) -> None:
    short, long = prefix_chain(conv(first)), prefix_chain(conv(first + more))
    assert long[: len(short)] == short
    assert longest_match(long, [d for d, _ in short]) == sum(len(c) for _, c in first)


@given(_messages, _messages)
def test_a_digest_is_shared_only_by_equal_prefixes(a, b) -> None:
    ca, cb = prefix_chain(conv(a)), prefix_chain(conv(b))
    for k, ((da, _), (db, _)) in enumerate(zip(ca, cb)):
        assert (da == db) == (a[: k + 1] == b[: k + 1])


def test_a_raw_prompt_is_chained_in_blocks() -> None:
    p = GenerationParams((), prompt="x" * 600)
    chain = prefix_chain(p)
    assert [c for _, c in chain] == [256, 512, 600]
    assert prefix_chain(GenerationParams((), prompt="x" * 600 + "y"))[:2] == chain[:2]
    assert all(0 <= d < 2**63 for d, _ in chain)


@given(st.lists(st.integers(0, 50), max_size=200), st.integers(0, 70))
def test_bounded_keeps_the_last_unique_digests(digests, limit) -> None:
    out = bounded(digests, limit)
    assert len(out) == len(set(out)) <= limit and set(out) <= set(digests)
    if limit >= len(set(digests)):
        assert set(out) == set(digests)
    if digests and limit:
        assert out[-1] == digests[-1]


_options = st.lists(
    st.builds(Option, st.text(alphabet="abcdef", min_size=1, max_size=3), st.floats(0, 4, allow_nan=False),
              st.integers(0, 1000)),
    min_size=1, max_size=6, unique_by=lambda o: o.instance_id)


@given(_options, st.floats(0, 2, allow_nan=False), st.randoms())
def test_choose_properties(options, slack, rnd) -> None:
    chosen, reason = choose(options, slack)
    by_id = {o.instance_id: o for o in options}
    least = min(o.load for o in options)
    pick = by_id[chosen]
    assert pick.load <= least + slack  # a prefix never sends a request to a much busier instance
    eligible = [o for o in options if o.load <= least + slack]
    if reason.startswith("prefix:"):
        assert pick.matched == max(o.matched for o in eligible) == int(reason.split(":")[1]) > 0
    else:  # nobody eligible holds a prefix: the least-loaded rule as before
        assert all(o.matched == 0 for o in eligible)
        assert (pick.load, pick.instance_id) == min((o.load, o.instance_id) for o in options)
        assert reason == ("load:busy" if any(o.matched for o in options) else "load")
    shuffled = list(options)
    rnd.shuffle(shuffled)
    assert choose(shuffled, slack) == (chosen, reason)


def test_choose_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        choose([])
    with pytest.raises(ValueError):
        choose([Option("a", 0, 0)], slack=-1)


def two_ready(max_batch: int = 4):
    s = one_node(total=64 * 2**30, available=64 * 2**30)
    instances = []
    for cid in ("inst-a", "inst-b"):
        d = handle_command(s, PlaceInstance(cid, "m"), rank_settings=RankSettings(prefill_chunk_size=32, max_batch=max_batch))
        assert d.result.error is None, d.result.error
        s = run(s, d.events)
        inst = d.result.instance
        s = run(s, [RunnerStatusUpdated(inst.shards[0].runner_id, inst.instance_id, "node-a", RunnerReady())])
        instances.append(inst)
    return s, instances


def submit(s, task_id: str, params: GenerationParams, routing: str = "prefix"):
    return handle_command(s, SubmitTask.generation(f"c-{task_id}", task_id, "m", params, "node-a"), routing=routing)


def test_the_master_routes_a_second_turn_to_the_holder_unless_it_is_much_busier() -> None:
    s, (a, b) = two_ready()
    turn1 = [("user", "tell me a story about the sea")]
    turn2 = turn1 + [("assistant", "Once upon a time"), ("user", "go on")]
    s = run(s, [InstancePrefixesUpdated("inst-b", entry_digests(conv(turn1)))])
    d = submit(s, "t1", conv(turn2))
    assert d.result.instance_id == "inst-b" and d.result.route == f"prefix:{len(turn1[0][1])}"
    assert submit(s, "t1", conv(turn2), routing="load").result.instance_id == "inst-a"  # least loaded, id order
    assert submit(s, "t9", conv([("user", "something else")])).result.route == "load"
    for i in range(3):  # b: 3 of 4 busy, a idle: 0.75 > 0.5 of slack
        s = run(s, [TaskCreated(msgspec.structs.replace(d.events[0].task, task_id=f"busy{i}"))])
    d = submit(s, "t2", conv(turn2))
    assert d.result.instance_id == "inst-a" and d.result.route == "load:busy"


def test_published_prefixes_are_bounded_forgotten_and_only_rank0s() -> None:
    s, (a, b) = two_ready()
    s = run(s, [InstancePrefixesUpdated("inst-a", tuple(range(500)))])
    assert s.prefixes["inst-a"] == tuple(range(500 - MAX_DIGESTS, 500))
    s = run(s, [InstancePrefixesUpdated("gone", (1, 2))])
    assert "gone" not in s.prefixes
    assert refuse_local(s, "node-a", InstancePrefixesUpdated("inst-a", (1,))) is None
    assert refuse_local(s, "node-b", InstancePrefixesUpdated("inst-a", (1,))) is not None
    s = run(s, [InstanceDeleted("inst-a")])
    assert "inst-a" not in s.prefixes


def test_the_prompt_cache_publishes_its_entries_digests() -> None:
    cache = PromptCache(max_tokens=10)
    first = conv([("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d"), ("user", "e")])
    assert cache.insert([1, 2, 3, 4], [], first)
    assert cache.digests() == entry_digests(first) and len(entry_digests(first)) == PER_ENTRY
    other = conv([("user", "zzz")])
    assert cache.insert([5, 6, 7, 8], [], other)
    assert cache.digests()[-1] == entry_digests(other)[-1]
    assert cache.insert([9, 9, 9], [], conv([("user", "third")]))  # 11 tokens > 10: the first goes
    assert not set(entry_digests(first)) & set(cache.digests())
    cache.reuse([5, 6, 7, 0])
    assert cache.hits == 1 and cache.reused_tokens == 3 and cache.digests()[-1] == entry_digests(other)[-1]
    cache.reuse([42, 42])
    assert cache.misses == 1


def test_the_runner_publishes_changes_at_most_every_gap_after_a_burst() -> None:
    now = [0.0]
    pub = PrefixPublisher(gap=0.2, clock=lambda: now[0], burst=2)
    assert pub.offer((1,)) == (1,)
    assert pub.offer((1,)) is None  # unchanged
    assert pub.offer((1, 2)) == (1, 2)  # quick turns publish at once, up to the burst
    now[0] = 0.1
    assert pub.offer((1, 2, 3)) is None and pub.flush() is None  # the bucket is empty: kept
    now[0] = 0.25
    assert pub.flush() == (1, 2, 3) and pub.flush() is None
    published = 0
    for i in range(50):  # a flood over 0.5 s: one publication per gap on average
        now[0] += 0.01
        published += pub.offer(tuple(range(i + 10))) is not None
    assert published <= 3 and pub.pending is not None
