"""What this node says about itself and the nodes it knows: ``GET /state``'s warnings and
counters (``NodeHealth``), ``GET /nodes``' summaries (``NodeSummary``), and whether it has
joined the cluster (its API waits for that at start). Pure functions of what the node's
parts report."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from exo_p2p.node.announce import no_peers_warning
from exo_p2p.api.backend import LinkSummary, NodeSummary
from exo_p2p.config import NO_PEERS_WARNING_AFTER
from exo_p2p.types import ModelCard, State


def health_warnings(*, alone_for: float | None, peer_left: bool, duplicate_identity: str | None,
                    master: str | None, bootstrap_failures: Mapping[str, str]) -> list[str]:
    """This node's warnings, in this order: no peer for ``NO_PEERS_WARNING_AFTER`` s
    (``alone_for``; ``peer_left``: it had one, which left), another node with its identity,
    no master elected yet, and one per bootstrap address it cannot reach (the prefix
    ``bootstrap peer unreachable:`` is what ``exo-p2p doctor`` looks for)."""
    warnings: list[str] = []
    alone = no_peers_warning(alone_for, peer_left, NO_PEERS_WARNING_AFTER)
    if alone is not None:
        warnings.append(alone)
    if duplicate_identity:
        warnings.append(duplicate_identity)
    if master is None:
        warnings.append("no master elected yet")
    for addr, error in sorted(bootstrap_failures.items()):
        warnings.append(f"bootstrap peer unreachable: {addr}: {error}")
    return warnings


def health_counters(*parts: Mapping[str, int]) -> dict[str, int]:
    """One table of counters from the node's parts, in order (a later part's count of the
    same name wins): the host's, the cluster member's, the master role's, the node's own."""
    counters: dict[str, int] = {}
    for part in parts:
        counters.update(part)
    return counters


def joined(state: State, node_id: str, boot_id: str, master: str | None, cards: Sequence[ModelCard]) -> bool:
    """Whether this node has joined: a master is known, State holds its profile *of this
    boot* (``boot_id``: a restarted node's log still holds the old one) and the card of every
    model it lists (``cards``). Until then its API would answer from a node still joining."""
    profile = state.nodes.get(node_id)  # type: ignore[call-overload]
    mine = profile is not None and profile.boot_id == boot_id
    return master is not None and mine and all(c.model_id in state.model_cards for c in cards)


def node_summaries(state: State, self_id: str, last_seen: Callable[[str], float | None]) -> list[NodeSummary]:
    """``GET /nodes``: every node in ``state`` by id, with its memory, addresses and the
    links it measured; ``last_seen(node id)`` is seconds since this node heard it (0 when
    never, rounded to 0.1 s)."""
    out = []
    for node_id, profile in sorted(state.nodes.items()):
        out.append(
            NodeSummary(
                node_id=node_id,
                friendly_name=profile.friendly_name,
                is_self=node_id == self_id,
                is_master=node_id == state.master,
                memory_total=profile.memory_total,
                memory_available=profile.memory_available,
                addrs=[a.multiaddr for a in profile.addrs],
                last_seen=round(last_seen(node_id) or 0.0, 1),
                speed=profile.speed,
                links=[
                    LinkSummary(sink, f.address, f.rtt_us, f.bytes_per_s, f.interface_type)
                    for sink, figures in sorted(state.links.get(node_id, {}).items())
                    for f in figures.values()
                ],
            )
        )
    return out
