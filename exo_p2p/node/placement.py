"""Placement as this node's API asks about it, answered with the master's own rules
(``master.placement.place``, ``master.placement.fetch``) on this node's State: a node named by the
user, and the placements a model could have. A composition module, like ``exo_p2p.node``."""

from __future__ import annotations

import msgspec

from exo_p2p.types import State
from master.placement.place import placement_previews
from master.placement.context import PlacementError, resolve_nodes
from master.placement.fetch import fetch_split


def resolve_node(state: State, name: str) -> str:
    """The node id for ``name`` (a node id, a friendly name or a unique id prefix).

    Raises ``ValueError`` naming an unknown or ambiguous name (the API answers 400)."""
    try:
        resolved = resolve_nodes(state, [name])
    except PlacementError as exc:
        raise ValueError(str(exc)) from None
    if not resolved:
        raise ValueError("an empty node name")
    return resolved[0]


def previews(state: State, model_id: str, nodes: tuple[str, ...]) -> list[dict]:
    """``ApiBackend.previews``: every placement of ``model_id`` (on ``nodes`` when given),
    as plain dicts with per node the bytes it would fetch, from peers and from a hub
    (``placement_fetch``). Raises ``KeyError`` for a model State has no card of, and
    ``PlacementError`` for an unknown node name."""
    card = state.model_cards.get(model_id)  # type: ignore[call-overload]
    if card is None:
        raise KeyError(model_id)
    required = resolve_nodes(state, nodes) if nodes else None
    out = []
    for p in placement_previews(state, card, nodes=required):
        split = fetch_split(state, card, p.sharding, p.nodes, p.fetch_bytes_per_node)
        hub = sum(h for _, h in split)
        out.append(
            {
                "sharding": p.sharding,
                "world_size": p.world_size,
                "nodes": list(p.nodes),
                "layers": list(p.layers_per_node),
                "bytes": list(p.bytes_per_node),
                "weights": list(p.weights_per_node),
                "fetch_bytes": list(p.fetch_bytes_per_node),  # from peers first (docs/models.md)
                "fetch_from_peers": [f for f, _ in split],
                "fetch_from_hub": [h for _, h in split],
                "fetch_from": "peers, then the hub" if hub else "peers",
                "network_us_per_token": p.network_us_per_token,  # estimated (docs/links.md)
                "links_measured": p.links_measured,
                "decode_us_per_token": p.decode_us_per_token,  # estimated (docs/placement-speed.md)
                "prefill_us_per_token": p.prefill_us_per_token,
                "memory_split_us_per_token": p.memory_split_us_per_token,
                "split_reason": p.split_reason,
                "error": p.error,
                "instance": msgspec.to_builtins(p.instance) if p.instance is not None else None,
            }
        )
    return out
