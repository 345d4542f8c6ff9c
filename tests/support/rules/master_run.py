"""Running the master's rules on a one-node state."""

from __future__ import annotations

from exo_p2p.state import apply
from exo_p2p.types import IndexedEvent, MasterElected, NodeModelsUpdated, NodeProfile, NodeProfileUpdated, State
from tests.support.rules.strategies import CARD


GIB = 1024**3


def run(state: State, events) -> State:
    for e in events:
        state = apply(state, IndexedEvent(term=1, idx=state.last_event_idx + 1, event=e))
    return state


def one_node(total=16 * GIB, available=16 * GIB) -> State:
    return run(
        State(),
        [
            MasterElected("node-a", 1),
            NodeProfileUpdated(NodeProfile("node-a", "boot-1", "a", memory_total=total, memory_available=available)),
            NodeModelsUpdated("node-a", (CARD,)),
        ],
    )
