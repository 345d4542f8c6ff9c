"""Bounds on the cards of models read from a hub, which every node holds in State (pure;
docs/security.md, docs/architecture.md#log-guarantees).

A model read from a hub (``HubModelResolved``) puts its card in ``State.model_cards`` and its
source in ``State.hub_models``. A model repository decides that card, so it is bounded here,
by rules every node applies identically from the log alone (no clocks, no local facts):

- **Size**: a card whose canonical msgpack encoding exceeds ``MAX_HUB_CARD_BYTES`` is refused
  (``card_too_large``): the reading node answers an error and the master never indexes it;
  ``apply`` ignores one that reached the log anyway.
- **Count**: State names at most ``MAX_HUB_MODELS`` hub models. A new one beyond that evicts
  the *evictable* one (below) resolved longest ago (``State.hub_resolved``: the log index
  of its last ``HubModelResolved``; ties by name); with none evictable the new one is ignored,
  and the reading node answers 507 before emitting it (``hub_room``).
- **Idle**: a hub model is *evictable* when no instance uses it and no node holds it as its
  own model (``NodeProfile.models``: then the node's card stays anyway). The master forgets
  hub models evictable for ``HUB_CARD_IDLE_S`` of its own time (``master.hub_forget``) with a
  ``HubModelsForgotten`` event; ``forget`` drops only those still evictable when it is
  applied, so every node drops the same ones at the same index. A master elected later starts
  its wait afresh: a card lives longer, never shorter.

Hence the hub cards of State take at most ``MAX_HUB_MODELS × MAX_HUB_CARD_BYTES`` (8 MiB).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from exo_p2p.types import HubModelResolved, State
from exo_p2p.types.models import ModelCard

MAX_HUB_CARD_BYTES = 64 * 1024
"""Bytes of a hub model's card, encoded as State holds it (msgpack). A card of a 1,000-layer
model with float32 sizes takes ~20 KiB; the largest real models have < 200 layers."""
MAX_HUB_MODELS = 128
"""Hub models State names at once."""
HUB_CARD_IDLE_S = 600.0
"""Seconds a hub model stays evictable before the master forgets it (``--hub-card-idle``)."""

_encoder = msgspec.msgpack.Encoder(order="sorted")
replace = msgspec.structs.replace


def card_bytes(card: ModelCard) -> int:
    """Bytes of ``card`` as State encodes it (canonical msgpack, ``state.hashing``)."""
    return len(_encoder.encode(card))


def card_too_large(card: ModelCard) -> str | None:
    """Why ``card`` may not enter State as a hub model's card (None: it may)."""
    n = card_bytes(card)
    if n > MAX_HUB_CARD_BYTES:
        return (f"model {card.model_id[:200]}'s card takes {n} bytes ({card.n_layers} layers), over the "
                f"{MAX_HUB_CARD_BYTES} a model read from a hub may take in the cluster's State")
    return None


def evictable(state: State) -> list[str]:
    """Hub models of ``state`` that no instance uses and no node holds as its own model, the
    one resolved longest ago first (ties by name)."""
    used = {inst.model_id for inst in state.instances.values()}
    held = {m for profile in state.nodes.values() for m in profile.models}
    free = [m for m in state.hub_models if m not in used and m not in held]
    return sorted(free, key=lambda m: (state.hub_resolved.get(m, 0), m))


def hub_room(state: State, model_id: str) -> str | None:
    """Why a new hub model ``model_id`` cannot enter ``state`` (None: it can): State names
    ``MAX_HUB_MODELS`` hub models already, all in use."""
    if model_id in state.hub_models or len(state.hub_models) < MAX_HUB_MODELS or evictable(state):
        return None
    return (f"the cluster holds the cards of {len(state.hub_models)} models read from a hub, all in use "
            f"(at most {MAX_HUB_MODELS}); delete an instance of one first")


def admit(state: State, event: HubModelResolved, idx: int) -> State:
    """``state`` after ``event`` at log index ``idx`` (module docstring): its card enters
    ``model_cards`` (a node's own copy's card stays), its source ``hub_models`` and ``idx``
    ``hub_resolved``; unchanged when the card is too large or no room can be made."""
    model_id = event.card.model_id
    if card_too_large(event.card) is not None:
        return state
    if model_id not in state.hub_models and len(state.hub_models) >= MAX_HUB_MODELS:
        victims = evictable(state)
        if not victims:
            return state
        state = forget(state, victims[:len(state.hub_models) - MAX_HUB_MODELS + 1])
    cards = dict(state.model_cards)
    cards.setdefault(model_id, event.card)
    return replace(state, model_cards=cards, hub_models={**state.hub_models, model_id: event.source},
                   hub_resolved={**state.hub_resolved, model_id: idx})


def forget(state: State, model_ids: Iterable[str]) -> State:
    """``state`` without the hub models ``model_ids`` that are evictable in it (the others
    stay): their source, resolve index and card (no node holds them, so the card is the hub's)."""
    gone = set(model_ids) & set(evictable(state))
    if not gone:
        return state
    return replace(state, model_cards={k: v for k, v in state.model_cards.items() if k not in gone},
                   hub_models={k: v for k, v in state.hub_models.items() if k not in gone},
                   hub_resolved={k: v for k, v in state.hub_resolved.items() if k not in gone})
