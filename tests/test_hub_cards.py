"""State stays bounded however many models are read from a hub (``exo_p2p.state.hub_cards``,
``master.hub_forget``, ``exo_p2p.state.budget``; docs/security.md): cards are bounded in size
and count, unused ones are forgotten by a master event every node applies alike, and a State
at every bound travels in one frame to a joining node."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p.cluster.messages import LogResponse, encode
from exo_p2p.net.config import NetConfig
from exo_p2p.state import apply, state_hash
from exo_p2p.state.budget import STATE_BUDGET_BYTES, state_bytes
from exo_p2p.state.hashing import canonical_bytes
from exo_p2p.state.hub_cards import (
    MAX_HUB_CARD_BYTES, MAX_HUB_MODELS, admit, card_bytes, card_too_large, evictable, forget, hub_room,
)
from exo_p2p.types import (
    ChatMessage, GenerationParams, HubModelResolved, HubModelsForgotten, IndexedEvent, Instance, InstanceCreated,
    InstanceDeleted, ModelCard, NodeModelsUpdated, NodeProfile, NodeProfileUpdated, ShardMetadata, State, TaskCreated,
    TextGeneration,
)
from exo_p2p.types.models import HubSource
from master.hub_forget import HubForgetClock
from master.in_flight import IN_FLIGHT_BYTES_LIMIT
from master.local_rules import refuse_local

pytestmark = pytest.mark.unit
FRAME = NetConfig.__dataclass_fields__["max_frame_bytes"].default


def card(model_id: str, n_layers: int = 4, layer: int = 3_000_000_000) -> ModelCard:
    """A card of ``n_layers`` layers of ``layer`` bytes (float32 sizes too: the largest card shape)."""
    layers = (layer,) * n_layers
    return ModelCard(model_id=model_id, n_layers=n_layers, hidden_size=4096, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128_000, context_length=131_072,
                     storage_size=sum(layers), layer_bytes=layers, embedding_bytes=0, head_bytes=0, norm_bytes=0,
                     tie_word_embeddings=True, float32_layer_bytes=tuple(4 * x for x in layers))


def resolved(model_id: str, n_layers: int = 4) -> HubModelResolved:
    return HubModelResolved("node-a", card(model_id, n_layers), HubSource(model_id, "a" * 40, "d" * 64))


def instance(instance_id: str, model_id: str) -> Instance:
    return Instance(instance_id, model_id, "pipeline", (ShardMetadata("node-a", f"{instance_id}-r0", 0, 1, 0, 4, 4, 1000, "b"),))


def run(events: list, state: State | None = None) -> State:
    state = state or State()
    for event in events:
        state = apply(state, IndexedEvent(1, state.last_event_idx + 1, event))
    return state


def test_a_card_over_its_bound_is_refused_by_the_master_and_ignored_by_apply():
    """A 600,000-layer card (what one repo made, 1.2 MB of event) never enters State."""
    huge = resolved("org/huge", 600_000)
    assert card_bytes(huge.card) > MAX_HUB_CARD_BYTES
    assert "over the 65536" in (card_too_large(huge.card) or "")
    assert refuse_local(State(), "node-a", huge) is not None
    assert refuse_local(State(), "node-a", resolved("org/small")) is None
    state = run([huge])
    assert state.hub_models == {} and state.model_cards == {} and state.last_event_idx == 1
    biggest = max(n for n in range(1, 5000) if card_bytes(card("org/x", n)) <= MAX_HUB_CARD_BYTES)
    assert biggest > 1000  # far above any real model's layer count


hub_steps = st.lists(st.one_of(
    st.builds(lambda i, n: resolved(f"org/m{i}", n), st.integers(0, 300), st.sampled_from([1, 4, 80, 3000])),
    st.builds(lambda i, m: InstanceCreated(instance(f"i{i}", f"org/m{m}")), st.integers(0, 3), st.integers(0, 300)),
    st.builds(lambda i: InstanceDeleted(f"i{i}"), st.integers(0, 3)),
    st.builds(lambda ms: HubModelsForgotten(tuple(f"org/m{m}" for m in ms)), st.lists(st.integers(0, 300), max_size=5)),
), max_size=400)


@settings(max_examples=60, deadline=None)
@given(hub_steps)
def test_hub_cards_stay_bounded_and_a_model_in_use_is_never_dropped(events):
    state = State()
    for event in events:
        before = state
        state = apply(state, IndexedEvent(1, state.last_event_idx + 1, event))
        assert len(state.hub_models) <= MAX_HUB_MODELS
        assert set(state.hub_resolved) == set(state.hub_models)
        assert all(card_bytes(state.model_cards[m]) <= MAX_HUB_CARD_BYTES for m in state.hub_models)
        used = {i.model_id for i in before.instances.values()}
        assert all(m in state.hub_models for m in used & set(before.hub_models))
    cards = sum(card_bytes(state.model_cards[m]) for m in state.hub_models)
    assert cards <= MAX_HUB_MODELS * MAX_HUB_CARD_BYTES


@settings(max_examples=40, deadline=None)
@given(hub_steps, st.integers(0, 400))
def test_the_rules_give_the_same_state_from_a_snapshot_as_from_the_whole_log(events, cut):
    """A node that installed a snapshot in the middle (dicts decoded in sorted order) ends
    with the same State hash as one that applied every event: the eviction order is by
    resolve index and name, never by dict order."""
    cut = min(cut, len(events))
    whole = run(events)
    head = run(events[:cut])
    installed = msgspec.msgpack.decode(canonical_bytes(head), type=State)
    assert state_hash(run(events[cut:], installed)) == state_hash(whole)


def test_beyond_the_count_the_oldest_unused_goes_and_with_none_unused_the_new_one_is_refused():
    state = run([resolved(f"org/m{i:03d}") for i in range(MAX_HUB_MODELS)])
    state = run([InstanceCreated(instance("i0", "org/m000"))], state)
    state = run([resolved("org/new")], state)
    assert "org/m000" in state.hub_models and "org/m001" not in state.hub_models and "org/new" in state.hub_models
    assert "org/m001" not in state.model_cards
    used = run([InstanceCreated(instance(f"i{m}", m)) for m in state.hub_models if m != "org/m000"], state)
    assert evictable(used) == [] and hub_room(used, "org/other") is not None
    assert run([resolved("org/other")], used).hub_models == used.hub_models


def test_forget_drops_only_what_no_instance_uses_and_no_node_holds():
    held = NodeProfile("node-b", "boot", "b", models=("org/held",))
    state = run([resolved("org/a"), resolved("org/used"), resolved("org/held"), NodeProfileUpdated(held),
                 NodeModelsUpdated("node-b", (card("org/held"),)), InstanceCreated(instance("i", "org/used"))])
    state = run([HubModelsForgotten(("org/a", "org/used", "org/held", "org/unknown"))], state)
    assert set(state.hub_models) == {"org/used", "org/held"}
    assert "org/a" not in state.model_cards and "org/held" in state.model_cards
    assert forget(state, ["org/used"]) is state


def test_the_master_forgets_after_the_idle_time_and_restarts_the_wait_when_used_again():
    clock = HubForgetClock(idle=600)
    state = run([resolved("org/a"), resolved("org/b")])
    assert clock.due(state, 1000.0) == ()
    busy = run([InstanceCreated(instance("i", "org/b"))], state)
    assert clock.due(busy, 1599.0) == ()
    assert clock.due(busy, 1600.0) == ("org/a",)
    idle_again = run([InstanceDeleted("i")], busy)
    assert clock.due(idle_again, 1700.0) == ("org/a",)
    assert clock.due(idle_again, 2299.0) == ("org/a",)
    assert clock.due(idle_again, 2300.0) == ("org/a", "org/b")


def test_a_state_at_every_bound_is_within_its_budget_and_one_frame():
    """The largest State clients and repositories can make: 16 MiB of request text (plus one
    request of 128 KiB), ``MAX_HUB_MODELS`` cards of ``MAX_HUB_CARD_BYTES``. A joining node
    receives it as one ``LogResponse``, which must fit the 64 MiB frame."""
    n_layers = max(n for n in range(1, 5000) if card_bytes(card("org/x" + "y" * 400, n)) <= MAX_HUB_CARD_BYTES)
    events: list = [resolved(f"org/{i:03d}" + "y" * 396, n_layers) for i in range(MAX_HUB_MODELS)]
    text = 128 * 1024
    for t in range(IN_FLIGHT_BYTES_LIMIT // text + 1):
        params = GenerationParams(messages=(ChatMessage("user", "x" * text),))
        events.append(TaskCreated(TextGeneration(f"t{t}", "i", "m", params, "node-a")))
    state = run(events)
    assert len(state.hub_models) == MAX_HUB_MODELS and len(state.tasks) == IN_FLIGHT_BYTES_LIMIT // text + 1
    size = state_bytes(state)
    print(f"State at the bounds: {size} bytes ({size / 2**20:.1f} MiB)")
    assert size <= STATE_BUDGET_BYTES
    frame = encode(LogResponse(snapshot=state, last_idx=state.last_event_idx, snapshot_chain=b"x" * 32, diverged=True))
    assert len(frame) <= STATE_BUDGET_BYTES < FRAME


class _Hub:
    """A hub that gives ``card`` for any name, counting the reads."""

    enabled = True

    def __init__(self, given: ModelCard) -> None:
        self.given, self.reads = given, 0

    async def resolve(self, name, depot):  # type: ignore[no-untyped-def]
        self.reads += 1
        return HubSource(name, "a" * 40, "d" * 64), self.given


def test_the_reading_node_refuses_a_large_card_and_a_full_state_before_emitting():
    import trio

    from exo_p2p.models.hub.announce import HubModels

    emitted: list = []
    full = run([resolved(f"org/m{i:03d}") for i in range(MAX_HUB_MODELS)]
               + [InstanceCreated(instance(f"i{i}", f"org/m{i:03d}")) for i in range(MAX_HUB_MODELS)])
    huge = _Hub(card("org/huge", 600_000))
    models = HubModels(huge, None, "node-a", State, emitted.append)
    _, error = trio.run(models.read, "org/huge")
    assert error is not None and error.status == 400 and error.code == "card_too_large" and emitted == []
    other = _Hub(card("org/new"))
    models = HubModels(other, None, "node-a", lambda: full, emitted.append)
    _, error = trio.run(models.read, "org/new")
    assert error is not None and error.status == 507 and error.code == "hub_models_full"
    assert other.reads == 0 and emitted == []  # refused before the hub was asked
