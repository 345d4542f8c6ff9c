"""The bounds on what a hub repo may make a node spend (``exo_p2p.models.hub_limits``), the
stop flag a hub thread checks (``hub.stop``) and the resolver that runs hub reads apart from
the node's threads (``hub.resolve``): pure rules as properties, the resolver with trio."""

from __future__ import annotations

import threading
import time

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p.models import hub_limits as L
from exo_p2p.models.card.derive import card_from_config
from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.hub.resolve import Resolver
from exo_p2p.models.hub.stop import HubStopped, HubTimeout, Stop
from exo_p2p.models.manifest import chunk_bounds

pytestmark = pytest.mark.unit


@settings(max_examples=300, deadline=None)
@given(size=st.integers(0, 1 << 22), cuts=st.lists(st.integers(-10, (1 << 22) + 10), max_size=20),
       chunk=st.integers(1 << 10, 1 << 20))
def test_chunk_count_is_the_length_of_chunk_bounds(size: int, cuts: list[int], chunk: int) -> None:
    assert L.chunk_count(size, cuts, chunk) == len(chunk_bounds(size, cuts, chunk))


def test_chunk_count_of_a_2_to_62_byte_file_is_arithmetic_and_refused() -> None:
    started = time.monotonic()
    n = L.chunk_count(1 << 62, [1000], 8 << 20)
    assert n == (1 << 62) // (8 << 20) + 1 and time.monotonic() - started < 0.1
    with pytest.raises(UnsupportedModelError, match=f"chunk count is {n}, more than the limit of {L.MAX_CHUNKS}"):
        L.check_chunks(n)
    L.check_chunks(L.MAX_CHUNKS)


@given(n=st.integers(-5, 10**12), named=st.sets(st.integers(0, 2000), max_size=50))
def test_layers_are_bounded_by_the_cap_and_the_named_layers(n: int, named: set[int]) -> None:
    if 1 <= n <= L.MAX_LAYERS and n <= len(named):
        assert L.check_layers(n, named) == n
    else:
        with pytest.raises(UnsupportedModelError, match="num_hidden_layers"):
            L.check_layers(n, named)


@pytest.mark.parametrize("value", ["x", None, [1], 1.5e300])
def test_layers_that_are_no_number_are_refused(value: object) -> None:
    with pytest.raises(UnsupportedModelError, match="num_hidden_layers"):
        L.check_layers(value, range(4) if value != 1.5e300 else range(4))


def test_a_card_with_a_billion_layers_is_refused_before_any_list_is_made() -> None:
    config = {"num_hidden_layers": 1_000_000_000, "hidden_size": 8, "vocab_size": 8}
    sizes = {"model.layers.0.w": 4, "model.embed_tokens.weight": 4}
    started = time.monotonic()
    with pytest.raises(UnsupportedModelError, match="num_hidden_layers is 1000000000"):
        card_from_config(config, sizes, "org/evil")
    assert time.monotonic() - started < 0.1


@given(path=st.sampled_from(["config.json", "tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt",
                             "x.tiktoken", "generation_config.json", "chat_template.jinja",
                             "model.safetensors.index.json"]),
       size=st.integers(-1, 1 << 40))
def test_small_files_are_capped_by_kind(path: str, size: int) -> None:
    cap = L.small_file_cap(path)
    assert cap == {"tokenizer": L.MAX_TOKENIZER_BYTES, "index": L.MAX_INDEX_BYTES}.get(
        "index" if "index" in path else "tokenizer" if any(k in path for k in ("tokenizer.", "vocab", "merges", "tiktoken")) else "",
        L.MAX_CONFIG_BYTES)
    if 0 <= size <= cap:
        L.check_listed_sizes([(path, size)], [])
    else:
        with pytest.raises(UnsupportedModelError, match=f"listed size of {path}"):
            L.check_listed_sizes([(path, size)], [])


def test_weight_files_and_the_total_are_capped() -> None:
    with pytest.raises(UnsupportedModelError, match=f"model.safetensors is {1 << 62}"):
        L.check_listed_sizes([("config.json", 10)], [("model.safetensors", 1 << 62)])
    many = [(f"model-{i}.safetensors", L.MAX_WEIGHT_FILE_BYTES) for i in range(5)]
    with pytest.raises(UnsupportedModelError, match="the model's files"):
        L.check_listed_sizes([], many)
    L.check_listed_sizes([("config.json", 10)], many[:2])


_offsets = st.lists(st.tuples(st.integers(0, 1 << 40), st.integers(0, 1 << 20)), min_size=1, max_size=20)


@given(tensors=_offsets, header=st.integers(9, 1 << 20), delta=st.integers(-5, 5))
def test_a_weight_file_must_end_where_its_header_says(tensors: list[tuple[int, int]], header: int, delta: int) -> None:
    h = {f"t{i}": {"dtype": "F32", "shape": [n], "data_offsets": [a, a + n]} for i, (a, n) in enumerate(tensors)}
    h["__metadata__"] = {"format": "mlx"}
    end = header + max(a + n for a, n in tensors)
    if delta == 0:
        L.check_weight_size("model.safetensors", end, header, h)
    else:
        with pytest.raises(UnsupportedModelError, match="listed size"):
            L.check_weight_size("model.safetensors", end + delta, header, h)


@pytest.mark.parametrize("offsets", [[5, 1], ["a", 2], [1], None, [-1, 3]])
def test_malformed_offsets_are_refused(offsets: object) -> None:
    with pytest.raises(UnsupportedModelError, match="data_offsets"):
        L.check_weight_size("m.safetensors", 100, 8, {"t": {"data_offsets": offsets}})


def test_too_many_tensors_and_siblings_are_refused() -> None:
    many = {f"t{i}": {"data_offsets": [0, 0]} for i in range(L.MAX_TENSORS + 1)}
    with pytest.raises(UnsupportedModelError, match="tensor count"):
        L.check_weight_size("m.safetensors", 8, 8, many)
    L.check_sibling_count(L.MAX_REPO_FILES)
    with pytest.raises(UnsupportedModelError, match=f"500000, more than the limit of {L.MAX_REPO_FILES}"):
        L.check_sibling_count(500_000)


def test_a_stop_is_seen_by_check_and_wait_and_its_deadline_passes() -> None:
    stop = Stop(None, "reading x")
    stop.check()
    child = stop.for_file(0.05, "reading a file")
    threading.Timer(0.05, stop.set).start()
    started = time.monotonic()
    with pytest.raises(HubStopped):
        stop.wait(10)
    assert time.monotonic() - started < 2
    with pytest.raises(HubStopped):
        child.check()  # shares the flag
    late = Stop(0.01, "reading y")
    time.sleep(0.02)
    with pytest.raises(HubTimeout, match="reading y took more than its deadline of 0.01 s"):
        late.check()
    assert Stop(100).for_file(1, "f").seconds == 1 and Stop(0.5).for_file(10, "f").seconds == 0.5


def test_the_resolver_shares_one_read_and_stops_its_thread_when_every_waiter_leaves() -> None:
    ended = threading.Event()

    def slow(x: int, stop: Stop) -> int:
        try:
            while True:
                stop.wait(0.01)
        finally:
            ended.set()

    def quick(x: int, stop: Stop) -> int:
        time.sleep(0.1)
        return x * 2

    async def main() -> None:
        r = Resolver(threads=2, deadline=30)
        got: list[int] = []

        async def ask() -> None:
            got.append(await r.run("k", quick, 21))

        async with trio.open_nursery() as n:
            for _ in range(10):
                n.start_soon(ask)
        assert got == [42] * 10 and r.started == 1  # single-flight
        with trio.move_on_after(0.2):
            await r.run("slow", slow, 1)  # the caller leaves: abandoned at once
        await trio.to_thread.run_sync(ended.wait, 5)
        assert ended.is_set() and r.limiter.borrowed_tokens == 0

    trio.run(main)


def test_the_resolver_deadline_answers_a_timeout() -> None:
    def forever(stop: Stop) -> None:
        while True:
            stop.wait(0.01)

    async def main() -> None:
        r = Resolver(threads=1, deadline=0.2)
        started = trio.current_time()
        with pytest.raises(HubTimeout, match="deadline of 0.2 s"):
            await r.run("k", forever)
        assert trio.current_time() - started < 2

    trio.run(main)


def test_weight_file_count_and_the_header_budget_are_bounded() -> None:
    many = [(f"model-{i}.safetensors", 10) for i in range(L.MAX_WEIGHT_FILES + 1)]
    with pytest.raises(UnsupportedModelError, match=f"more than the limit of {L.MAX_WEIGHT_FILES}"):
        L.check_listed_sizes([], many)
    budget = L.HeaderBudget(100)
    budget.take("a", 60)
    budget.take("b", 40)
    with pytest.raises(UnsupportedModelError, match="MAX_HEADERS_BYTES"):
        budget.take("c", 1)


def test_a_preview_keeps_the_card_for_this_node_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``HubModels.preview``: the card read from a hub is kept in memory (``PREVIEW_CACHE``
    models at most), shared by later previews and revisions, added to a local copy of State
    for the previews, and never emitted (State unchanged: only a placement adds it)."""
    from exo_p2p.models.hub.announce import HubModels
    from exo_p2p.models.hub.fetch import HubAccess
    from exo_p2p.types import State
    from exo_p2p.types.models import HubSource

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    config = {"num_hidden_layers": 2, "hidden_size": 8, "vocab_size": 8}
    card = card_from_config(config, {"model.layers.0.w": 4, "model.layers.1.w": 4}, "org/m")
    access, calls, emitted = HubAccess(), [], []

    async def read(name: str):  # type: ignore[no-untyped-def]
        calls.append(name)
        return HubSource(name.partition("@")[0], "a" * 40, "d" * 64), card, None, {}

    access.read = read  # type: ignore[method-assign]
    state = State()
    models = HubModels(access, None, "n", lambda: state, emitted.append)

    async def main() -> None:
        assert await models.preview("org/m@v1") == ("org/m", None)
        assert await models.preview("org/m@v1") == ("org/m", None)
        assert calls == ["org/m@v1"]  # kept, not read again
        local = models.preview_state(state, "org/m")
        assert local.model_cards["org/m"] == card and local.hub_models["org/m"].repo_id == "org/m"
        assert state.model_cards == {} and state.hub_models == {} and emitted == []
        for i in range(L.PREVIEW_CACHE + 5):
            await models.preview(f"org/x{i}")
        assert len(access._previews) == L.PREVIEW_CACHE and models.preview_state(state, "org/m") is state
        assert await models.preview("not a repo") == ("not a repo", None)

    trio.run(main)
