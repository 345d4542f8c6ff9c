"""A pipeline and cluster for memory admission."""

from __future__ import annotations

from exo_p2p.state import apply
from exo_p2p.types import ChatMessage, GenerationParams, IndexedEvent, Instance, InstanceCreated, MasterElected, ModelCard, NodeModelsUpdated, NodeProfile, NodeProfileUpdated, RunnerReady, RunnerStatusUpdated, ShardMetadata, State


GIB = 1024**3


def _pipeline(card: ModelCard, cuts: list[int], nodes: list[str]) -> Instance:
    """A pipeline instance of ``card`` with layer boundaries ``cuts`` (sorted, inside)."""
    bounds = [0, *cuts, card.n_layers]
    shards = tuple(
        ShardMetadata(nodes[r], f"r{r}", r, len(bounds) - 1, bounds[r], bounds[r + 1], card.n_layers, 1, "boot-1")
        for r in range(len(bounds) - 1)
    )
    return Instance("inst", card.model_id, "pipeline", shards)


def _params(text: str, role: str = "user") -> GenerationParams:
    return GenerationParams((ChatMessage(role, text),), max_tokens=16)  # type: ignore[arg-type]


def _run(state: State, events) -> State:
    for e in events:
        state = apply(state, IndexedEvent(term=1, idx=state.last_event_idx + 1, event=e))
    return state


def _cluster(card: ModelCard, free: dict[str, int | None], inst: Instance) -> State:
    events: list = [MasterElected("a", 1)]
    for node, avail in free.items():
        events.append(NodeProfileUpdated(NodeProfile(node, "boot-1", node, memory_total=16 * GIB, memory_available=avail)))
        events.append(NodeModelsUpdated(node, (card,)))
    events.append(InstanceCreated(inst))
    events += [RunnerStatusUpdated(s.runner_id, inst.instance_id, s.node_id, RunnerReady()) for s in inst.shards]
    return _run(State(), events)


CARD8 = ModelCard("m", 8, 256, 8, 2, 1000, 4096, 800, (100,) * 8, 0, 0, 0, True)
