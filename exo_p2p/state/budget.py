"""The byte budget of the replicated State (docs/security.md).

Every node holds State, and a node that joins (or falls behind past the compacted log)
receives it whole in one ``LogResponse`` (``exo_p2p.cluster.log_sync.log_answer``), one frame
of at most 64 MiB (``exo_p2p.net.config.NetConfig.max_frame_bytes``). What clients and model
repositories can add to it is bounded elsewhere; the sum of those bounds is the budget:

- request text of unfinished tasks: ``master.in_flight.IN_FLIGHT_BYTES_LIMIT`` (16 MiB, one
  request of at most 128 KiB past it);
- cards of models read from a hub: ``MAX_HUB_MODELS × MAX_HUB_CARD_BYTES``
  (``exo_p2p.state.hub_cards``: 8 MiB);
- the rest (nodes, edges, link figures, instances, runners, prefix digests): ``OTHER_BYTES``,
  8 MiB, grows with the nodes and instances of the cluster, not with traffic.

``STATE_BUDGET_BYTES`` (32 MiB) is half the frame: ``exo_state_bytes`` (a Prometheus gauge,
``exo_p2p.metrics.collect``) against ``exo_state_budget_bytes`` shows how close a node is.
"""

from __future__ import annotations

from exo_p2p.state.hashing import canonical_bytes
from exo_p2p.types import State

STATE_BUDGET_BYTES = 32 * 1024 * 1024
"""Bytes the canonical encoding of State may take (module docstring)."""
OTHER_BYTES = 8 * 1024 * 1024
"""The budget's share for what grows with the cluster's size, not its traffic."""


def state_bytes(state: State) -> int:
    """Bytes of ``state``'s canonical msgpack encoding (``state.hashing``), what a snapshot carries."""
    return len(canonical_bytes(state))
