"""What one placement request is, and the errors placement raises.

``placement_context`` reads State once per request (``master/placement/place.py``): the nodes
that may take a rank (``eligible``: memory reported, the model held or fetchable from peers,
the same files under the model's name as most holders) and why the others may not
(``excluded``), the required nodes (``resolve_nodes``), the topology among the eligible, and
whether the search is exact (up to ``EXACT_SEARCH_MAX_NODES``). The context is a frozen
record of the request's inputs: it holds no search state. The search of the request, its
memory modes and what it memoises, is one ``master.placement.search.Search`` made per
request; this module imports nothing of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from exo_p2p.models.card.families import sharding_problem
from exo_p2p.types import ModelCard, NodeId, Sharding, State
from master.model_identity import mismatched_nodes
from master.placement.fetch import fetcher_problem, holds_model
from master.placement.split import tensor_divisibility_problem
from master.placement.topology import Topology, topology_from_state

GIB = 1 << 30
EXACT_SEARCH_MAX_NODES = 8
"""Up to this many eligible nodes the cycle search is exact (no budget)."""
SHARDINGS: tuple[Sharding, ...] = ("pipeline", "tensor")


class PlacementError(ValueError):
    """No placement exists; the message says why, in numbers (GiB with one decimal and bytes)."""


def required_bytes(storage_size: int) -> int:
    """Bytes a cycle must offer for a model of ``storage_size`` bytes: ``ceil(1.1 * size)``,
    in integers (10% headroom, docs/architecture.md#rules)."""
    return -(-storage_size * 11 // 10)


def gib(n: int) -> str:
    """``n`` bytes as GiB with one decimal, e.g. ``"24.0 GiB"``."""
    return f"{n / GIB:.1f} GiB"


def resolve_nodes(state: State, names: Iterable[str]) -> tuple[NodeId, ...]:
    """Node ids for ``names``, each a node id, a friendly name or a unique prefix of a node id
    (tried in that order), in the given order without repeats.

    Raises ``PlacementError`` naming an unknown or ambiguous name.
    """
    resolved: list[NodeId] = []
    for raw in names:
        name = raw.strip()
        if not name:
            continue
        if name in state.nodes:
            match = [NodeId(name)]
        else:
            match = sorted(n for n, p in state.nodes.items() if p.friendly_name == name)
            if not match:
                match = sorted(n for n in state.nodes if n.startswith(name))
        if not match:
            known = ", ".join(label(state, n) for n in sorted(state.nodes)) or "none"
            raise PlacementError(f"unknown node {name!r}; nodes in the cluster: {known}")
        if len(match) > 1:
            raise PlacementError(f"node name {name!r} is ambiguous: it matches {', '.join(match)}")
        if match[0] not in resolved:
            resolved.append(match[0])
    return tuple(resolved)


@dataclass(frozen=True)
class PlacementContext:
    """One placement request: the inputs, the nodes that may take a rank (``eligible``) and
    why the others may not (``excluded``: node -> reason), the nodes hosting a shard of an
    existing instance (``hosts``), the nodes that must fetch the model first (``fetchers``)
    and the reason the request cannot be placed at all (``blocking``). Holds no search state
    (``master.placement.search.Search`` does, per request)."""

    state: State
    card: ModelCard
    required: frozenset[NodeId]
    eligible: tuple[NodeId, ...]
    excluded: dict[NodeId, str]
    hosts: frozenset[NodeId]
    topology: Topology
    exact: bool
    blocking: str | None
    fetchers: frozenset[NodeId] = frozenset()


def label(state: State, node: NodeId) -> str:
    """The node's friendly name when it is set and unique, else its id."""
    name = state.nodes[node].friendly_name if node in state.nodes else ""
    if name and sum(1 for p in state.nodes.values() if p.friendly_name == name) == 1:
        return name
    return node


def placement_context(state: State, card: ModelCard, nodes: Iterable[str] | None) -> PlacementContext:
    """The ``PlacementContext`` of placing ``card`` on ``state`` with the required ``nodes``
    (names, ``resolve_nodes``; raises ``PlacementError`` for an unknown or ambiguous one)."""
    required = frozenset(resolve_nodes(state, nodes or ()))
    excluded: dict[NodeId, str] = {}
    fetchers: set[NodeId] = set()
    for node, profile in sorted(state.nodes.items()):
        if profile.memory_total is None or profile.memory_available is None:
            excluded[node] = "memory not yet reported"
        elif card.model_id not in profile.models:
            problem = fetcher_problem(state, node, card.model_id)  # fetch from peers: master.placement.fetch
            if problem is not None:
                excluded[node] = problem
            elif not holds_model(state, node, card.model_id):
                fetchers.add(node)
    # one manifest per name: nodes with other files under the name are not candidates (master.model_identity)
    for node, reason in mismatched_nodes(state, card.model_id).items():
        excluded.setdefault(node, reason)
    eligible = tuple(n for n in sorted(state.nodes) if n not in excluded)
    blocking = None
    bad = sorted(n for n in required if n in excluded)
    if bad:
        blocking = "required " + "; ".join(f"node {label(state, n)}: {excluded[n]}" for n in bad)
    hosts = frozenset(s.node_id for inst in state.instances.values() for s in inst.shards)
    exact = len(eligible) <= EXACT_SEARCH_MAX_NODES
    topology = topology_from_state(state, eligible)
    return PlacementContext(state, card, required, eligible, excluded, hosts, topology, exact, blocking,
                            fetchers=frozenset(n for n in fetchers if n not in excluded))


def size_problem(card: ModelCard, sharding: Sharding, size: int) -> str | None:
    """Why no cycle of ``size`` nodes can take the model whatever the nodes, or None: the
    family's rule first (``exo_p2p.models.card.families``), then the sizes."""
    if size > 1 and (problem := family_problem(card, sharding)):
        return problem
    if sharding == "tensor":
        return tensor_divisibility_problem(card, size)
    if size > card.n_layers:
        return f"pipeline over {size} nodes needs at least {size} layers; the model has {card.n_layers}"
    return None


def family_problem(card: ModelCard, sharding: Sharding) -> str | None:
    """Why the model's family cannot be split by ``sharding``, or None (``exo_p2p.models.card.families``)."""
    return sharding_problem(card.architecture, sharding, supports_tensor=card.supports_tensor)
