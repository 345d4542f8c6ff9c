"""Placement: choose a cycle of nodes and a shard per node for a model (docs/architecture.md#rules).

Pure functions of ``State`` and a ``ModelCard``; no I/O, no clock, no randomness: the same input
always gives the same ``Instance``.

Rules, in the order they are applied:

- **Candidates** are simple cycles of the topology (``exo_p2p.state.topology``; a single node is
  a cycle) with ``len >= min_nodes``, containing every required node, in which every node
  reports its memory (``memory_total`` and ``memory_available`` not None — never counted as 0)
  and holds the model (``model_id`` in ``NodeProfile.models``) or may fetch it from peers
  (``master.placement_fetch``: some node publishes a complete copy and the node reports its
  free disk), and every link of the ring has an address (an edge without one does not count).
  A rank on a node that fetches needs the disk for its shard's bytes
  (``placement_fetch.disk_problem``); a cycle where one does not have it is not taken. A node holding other files under the
  model's name than most holders (another manifest digest, ``master.model_identity``) is
  not a candidate: placement never mixes two models that share a name.
- **Memory**: ``sum(usable) >= 1.1 * storage_size``, computed exactly as
  ``sum(usable) >= required_bytes(storage_size) = ceil(storage_size * 11 / 10)`` (for an
  integer sum the two are the same). ``usable(n)`` is ``memory_total`` when no node of the
  cycle hosts a shard of an instance in ``state.instances``, else ``master.memory.usable_memory``:
  ``min(memory_available, memory_total − Σ share_bytes State places on n)``, so a placement
  counts the moment it is indexed, not when the node re-reports its memory.
- **Choice order** among candidates (see ``topology.cycle_key``): (1) fewest nodes, (2) the
  least estimated network cost per token of the ring (``exo_p2p.links.cost``: per hop RTT +
  bytes ÷ bandwidth of its cheapest address, summed for pipeline, the slowest hop per
  all-reduce step for tensor; measured figures from ``State.links``, assumed ones by interface
  type while unmeasured), then as ties (2b) the
  best worst link of the ring (Thunderbolt 3 > Ethernet 2 > Wi-Fi 1 > loopback/other 0, from
  the edges' ``interface_type``), (3) the largest sum of link ranks, (4) the most usable
  memory, (5) node ids: the smallest tuple of ``(-usable, node id)`` over the ranks in rank
  order — the cycle whose rank 0, then rank 1, ... has more usable memory, ties to the smaller
  node id (so among equal machines: the smallest ids, in ascending order). The first candidate
  in this order whose every rank's share fits its node's usable memory wins. Tie rule (5) is
  used instead of "sorted node ids" because the search can bound it from a path prefix.
- **Ranks**: rank 0 is the member with the most usable memory (ties: smallest node id); ranks
  follow the cycle's direction from there. Shares: ``placement_split``.
- **Weights per rank**: each node's profile says what its runners may hold
  (``cpu_weights``: auto / float32 / stored; a Metal node and an old profile say stored). An
  auto rank holds float32 when its float32 share fits its usable memory with the 10%
  headroom, else the stored weights; the shard records it (``weights_dtype``) and its
  ``share_bytes`` are in those bytes (``placement_split.pipeline_shares``).
- **Ring addresses** (world size > 1): rank r listens at ``ip:port`` where ``ip`` is the
  cheapest address of the link (rank r-1 → rank r) for the bytes that hop carries
  (``Link.best``: measured figures first, else the edge's address) — the address at which its
  ring neighbour reaches it, chosen once here so both neighbours see the same — and ``port`` is the lowest port >=
  ``RING_BASE_PORT`` that no shard of an existing instance uses on that node, nor any shard (or
  an earlier rank of this instance) at that IP (several nodes may share one machine).
- **Scale**: up to ``EXACT_SEARCH_MAX_NODES`` eligible nodes the search is exact: one branch and
  bound per (size, memory mode), ``CycleSearch.best``. Beyond, one heuristic search per memory
  mode serves every size, both shardings and the error messages: ``CycleSearch.sweep``, a
  depth-first search of at most ``SWEEP_BUDGET`` path extensions that records, per cycle
  length, the best cycle it meets (by the choice order, among those that fit, per sharding)
  and the heaviest one (for "the largest candidate cycle" in errors). ``place_instance`` and
  ``placement_previews`` read the same records, so a preview is still exactly the placement.
  What it gives up: on a full mesh of equal links nothing (the first path from the heaviest
  node is the heaviest node set, in rank order, for every length); with mixed links or sparse
  edges (e.g. a ring plus a few extra edges) a cycle worse than the best may be chosen, a
  size may be reported as having no fitting cycle when one exists (placement then takes the
  next size it found), and "the largest candidate cycle" in errors is the largest one met.
  Cost: bounded by the budget plus one reachability pass per start tried, whatever the number
  of sizes (previews at 64 nodes take milliseconds, not seconds).
"""

from __future__ import annotations

import hashlib

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgspec

from exo_p2p.links.cost import CostModel, cost_model
from exo_p2p.models.families import sharding_problem
from exo_p2p.state.topology import CycleKey, CycleSearch, Found, Goal, Topology, topology_from_state
from exo_p2p.types import Instance, InstanceId, ModelCard, ModelId, NodeId, RunnerId, ShardMetadata, Sharding, State
from master.memory import usable_memory
from master.model_identity import mismatched_nodes
from master.placement_fetch import disk_problem, fetch_source_digest, fetcher_problem, holds_model, shard_fetch_bytes
from master.placement_split import (
    Overflow,
    RankShare,
    pipeline_shares,
    tensor_divisibility_problem,
    tensor_share_bytes,
    tensor_shares,
)

GIB = 1 << 30
RING_BASE_PORT = 29600
"""Lowest port a ring member listens on. Below Linux's ephemeral range (32768–60999) and
macOS's (49152–65535): a ring port inside it is often held by some client connection's
local port or its TIME_WAIT (a test polling HTTP APIs leaves hundreds), and MLX's ring then
fails to bind it ("Couldn't bind socket (error: 98)")."""
RING_PORT_SPAN = 1000
"""Ring ports are chosen in ``[RING_BASE_PORT, RING_BASE_PORT + RING_PORT_SPAN)``."""
EXACT_SEARCH_MAX_NODES = 8
"""Up to this many eligible nodes the cycle search is exact (no budget)."""
SWEEP_BUDGET = 8000
"""Successors examined by the one heuristic search per memory mode beyond ``EXACT_SEARCH_MAX_NODES``
(enough for the first full path of a mesh of up to ~89 nodes: n*n/2 within half the budget)."""
SHARDINGS: tuple[Sharding, ...] = ("pipeline", "tensor")


class PlacementError(ValueError):
    """No placement exists; the message says why, in numbers (GiB with one decimal and bytes)."""


class Preview(msgspec.Struct, frozen=True):
    """The best placement for one (sharding, world size), or why there is none.

    ``instance`` is exactly what ``place_instance(..., min_nodes=world_size)`` returns for the
    same inputs (instance id ``"preview"``). ``nodes``, ``bytes_per_node`` (bytes each rank
    loads, in the weights it holds), ``layers_per_node``, ``weights_per_node`` (``"stored"``
    or ``"float32"``) and ``fetch_bytes_per_node`` (stored bytes the rank's node fetches from
    peers first, 0 when it holds the model; ``master.placement_fetch``) are in rank order;
    empty when ``error`` is set. ``network_us_per_token`` is the ring's estimated network cost
    per decoded token in microseconds (``exo_p2p.links.cost``; 0 for one node) and
    ``links_measured`` whether every hop's chosen address was measured (else assumed figures).
    """

    sharding: Sharding
    world_size: int
    instance: Instance | None = None
    nodes: tuple[NodeId, ...] = ()
    bytes_per_node: tuple[int, ...] = ()
    layers_per_node: tuple[int, ...] = ()
    error: str | None = None
    weights_per_node: tuple[str, ...] = ()
    fetch_bytes_per_node: tuple[int, ...] = ()
    network_us_per_token: int = 0
    links_measured: bool = True


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
            known = ", ".join(_label(state, n) for n in sorted(state.nodes)) or "none"
            raise PlacementError(f"unknown node {name!r}; nodes in the cluster: {known}")
        if len(match) > 1:
            raise PlacementError(f"node name {name!r} is ambiguous: it matches {', '.join(match)}")
        if match[0] not in resolved:
            resolved.append(match[0])
    return tuple(resolved)


def place_instance(
    state: State,
    model_card: ModelCard,
    *,
    min_nodes: int = 1,
    sharding: Sharding = "pipeline",
    nodes: Iterable[str] | None = None,
    instance_id: str = "preview",
) -> Instance:
    """The best placement of ``model_card`` on ``state``'s cluster (rules: module docstring).

    ``nodes``: names (``resolve_nodes``) of nodes the placement must include. The instance's
    shards are in rank order; runner ids are ``f"{instance_id}-r{rank}"``.

    Raises ``PlacementError`` with the reason: ``min_nodes`` larger than the cluster, a required
    node unknown / without memory report / without the model, no world size the model can be
    tensor-sharded over, no cycle at all, not enough memory (needed vs the largest candidate
    cycle, GiB and bytes), or no cycle where every rank's share fits.
    """
    if sharding not in SHARDINGS:
        raise PlacementError(f"unknown sharding {sharding!r}; use pipeline or tensor")
    if min_nodes < 1:
        raise PlacementError(f"min_nodes must be at least 1, got {min_nodes}")
    if min_nodes > len(state.nodes):
        raise PlacementError(f"min_nodes={min_nodes} but the cluster has {len(state.nodes)} nodes")
    ctx = _context(state, model_card, nodes)
    if ctx.blocking is not None:
        raise PlacementError(ctx.blocking)
    if sharding == "tensor" and not model_card.supports_tensor:
        raise PlacementError(f"model {model_card.model_id} does not support tensor sharding ({_family_problem(model_card, sharding)})")
    sizes = range(max(min_nodes, len(ctx.required)), len(ctx.eligible) + 1)
    for size in sizes:
        if _size_problem(model_card, sharding, size) is not None:
            continue
        plan = _best_of_size(ctx, sharding, size)
        if plan is not None:
            return _instance(ctx, plan, sharding, instance_id)
    raise PlacementError(_explain(ctx, sharding, max(min_nodes, len(ctx.required)), list(sizes)))


def placement_previews(state: State, model_card: ModelCard, *, nodes: Iterable[str] | None = None) -> list[Preview]:
    """One ``Preview`` per (sharding, world size) for world sizes 1..len(state.nodes),
    pipeline first. Each is the best placement of exactly that size — identical to
    ``place_instance(state, model_card, min_nodes=world_size, sharding=..., nodes=nodes)`` —
    or the reason there is none. Raises ``PlacementError`` only for unknown/ambiguous names."""
    ctx = _context(state, model_card, nodes)
    previews: list[Preview] = []
    for sharding in SHARDINGS:
        for size in range(1, len(state.nodes) + 1):
            previews.append(_preview(ctx, sharding, size))
    return previews


# --- internals -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Context:
    """What every search of one placement request shares."""

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
    searches: dict[tuple[int, bool], CycleSearch] = field(default_factory=dict)
    sweeps: dict[int, list[dict[int, Found]]] = field(default_factory=dict)
    modes: list[_Mode] = field(default_factory=list)


@dataclass(frozen=True)
class _Plan:
    """A chosen cycle (rank order), its key, each rank's usable bytes and share."""

    key: CycleKey
    cycle: tuple[NodeId, ...]
    usable: tuple[int, ...]
    shares: tuple[RankShare, ...]


def _label(state: State, node: NodeId) -> str:
    """The node's friendly name when it is set and unique, else its id."""
    name = state.nodes[node].friendly_name if node in state.nodes else ""
    if name and sum(1 for p in state.nodes.values() if p.friendly_name == name) == 1:
        return name
    return node


def _context(state: State, card: ModelCard, nodes: Iterable[str] | None) -> _Context:
    required = frozenset(resolve_nodes(state, nodes or ()))
    excluded: dict[NodeId, str] = {}
    fetchers: set[NodeId] = set()
    for node, profile in sorted(state.nodes.items()):
        if profile.memory_total is None or profile.memory_available is None:
            excluded[node] = "memory not yet reported"
        elif card.model_id not in profile.models:
            problem = fetcher_problem(state, node, card.model_id)  # fetch from peers: master.placement_fetch
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
        blocking = "required " + "; ".join(f"node {_label(state, n)}: {excluded[n]}" for n in bad)
    hosts = frozenset(s.node_id for inst in state.instances.values() for s in inst.shards)
    exact = len(eligible) <= EXACT_SEARCH_MAX_NODES
    return _Context(state, card, required, eligible, excluded, hosts, topology_from_state(state, eligible), exact, blocking,
                    fetchers=frozenset(n for n in fetchers if n not in excluded))


def _size_problem(card: ModelCard, sharding: Sharding, size: int) -> str | None:
    """Why no cycle of ``size`` nodes can take the model whatever the nodes, or None: the
    family's rule first (``exo_p2p.models.families``), then the sizes."""
    if size > 1 and (problem := _family_problem(card, sharding)):
        return problem
    if sharding == "tensor":
        return tensor_divisibility_problem(card, size)
    if size > card.n_layers:
        return f"pipeline over {size} nodes needs at least {size} layers; the model has {card.n_layers}"
    return None


def _family_problem(card: ModelCard, sharding: Sharding) -> str | None:
    return sharding_problem(card.architecture, sharding, supports_tensor=card.supports_tensor)


_Mode = tuple[dict[NodeId, int], frozenset[NodeId] | None]


def _modes(ctx: _Context) -> list[_Mode]:
    """(weights = usable bytes, must include one of) for the two memory modes: cycles with no
    node hosting an instance count total memory; cycles with one count available memory as
    State sees it (``master.memory.usable_memory``)."""
    if ctx.modes:
        return ctx.modes
    profiles = ctx.state.nodes
    free = {n: profiles[n].memory_total or 0 for n in ctx.eligible if n not in ctx.hosts}
    modes: list[_Mode] = [(free, None)]
    hosts = frozenset(n for n in ctx.eligible if n in ctx.hosts)
    if hosts:
        modes.append(({n: usable_memory(ctx.state, n) or 0 for n in ctx.eligible}, hosts))
    ctx.modes.extend(modes)
    return modes


def _search(ctx: _Context, mode: int, rank_links: bool = True) -> tuple[CycleSearch, _Mode]:
    """The prepared cycle search of memory mode ``mode`` (index into ``_modes``), cached."""
    modes = _modes(ctx)
    key = (mode, rank_links)
    if key not in ctx.searches:
        ctx.searches[key] = CycleSearch(ctx.topology, modes[mode][0], rank_links=rank_links)
    return ctx.searches[key], modes[mode]


def _shares(card: ModelCard, sharding: Sharding, usable: list[int], policies: list[str] | None = None) -> list[RankShare] | Overflow:
    if sharding == "tensor":
        return tensor_shares(card, usable, policies)
    return pipeline_shares(card, usable, policies)


def _policies(state: State, cycle: Iterable[NodeId]) -> list[str]:
    """Per rank, the weights its node's runners may hold (``NodeProfile.cpu_weights``)."""
    return [state.nodes[n].cpu_weights for n in cycle]


def _fits(ctx: _Context, sharding: Sharding, weights: dict[NodeId, int]) -> Callable[[tuple[NodeId, ...]], tuple[tuple[int, ...], list[RankShare]] | None]:
    """The search's ``accept``: (usable per rank, shares) when every rank's share fits, else None."""

    def accept(cycle: tuple[NodeId, ...]) -> tuple[tuple[int, ...], list[RankShare]] | None:
        usable = [weights[n] for n in cycle]
        shares = _shares(ctx.card, sharding, usable, _policies(ctx.state, cycle))
        if isinstance(shares, Overflow) or _disk_short(ctx, sharding, cycle, shares) is not None:
            return None
        return tuple(usable), shares

    return accept


def _fetch_bytes(ctx: _Context, sharding: Sharding, cycle: tuple[NodeId, ...], shares: Iterable[RankShare]) -> list[int]:
    """Per rank, the stored bytes its node fetches from peers (0: it holds the model)."""
    return [
        shard_fetch_bytes(ctx.card, sharding, rank, len(cycle), share.start_layer, share.end_layer)
        if node in ctx.fetchers else 0
        for rank, (node, share) in enumerate(zip(cycle, shares, strict=True))
    ]


def _disk_short(ctx: _Context, sharding: Sharding, cycle: tuple[NodeId, ...], shares: Iterable[RankShare]) -> tuple[int, int, int, int] | None:
    """``(rank, fetch, need, have)`` of the first rank whose node lacks the disk for the
    bytes it fetches (bytes), or None."""
    for rank, fetch in enumerate(_fetch_bytes(ctx, sharding, cycle, shares)):
        short = disk_problem(ctx.state, cycle[rank], fetch)
        if short is not None:
            return rank, fetch, *short
    return None


def _sweep(ctx: _Context, mode: int) -> list[dict[int, Found]]:
    """The heuristic's records of memory mode ``mode`` (beyond ``EXACT_SEARCH_MAX_NODES``),
    cached: per length, the best fitting cycle for each of ``SHARDINGS``, then the heaviest."""
    if mode not in ctx.sweeps:
        search, (weights, include) = _search(ctx, mode)
        lengths = range(1, len(ctx.eligible) + 1)
        goals: list[Goal] = [
            Goal(
                _fits(ctx, sharding, weights),
                frozenset(k for k in lengths if _size_problem(ctx.card, sharding, k) is None)
                if sharding == "pipeline" or ctx.card.supports_tensor else frozenset(),
                required_bytes(ctx.card.storage_size),
                cost=_cost_of(ctx.card, sharding),
            )
            for sharding in SHARDINGS
        ]
        goals.append(Goal(lambda cycle: True, frozenset(lengths), rank_links=False))
        ctx.sweeps[mode] = search.sweep(goals, required=ctx.required, include_one_of=include, budget=SWEEP_BUDGET)
    return ctx.sweeps[mode]


def _best_of_size(ctx: _Context, sharding: Sharding, size: int) -> _Plan | None:
    """The best fitting cycle of exactly ``size`` nodes, or None (exact search or the
    heuristic's record; module docstring "Scale")."""
    best: Found | None = None
    for mode in range(len(_modes(ctx))):
        if ctx.exact:
            search, (weights, include) = _search(ctx, mode)
            found = search.best(
                size,
                _fits(ctx, sharding, weights),
                min_weight=required_bytes(ctx.card.storage_size),
                required=ctx.required,
                include_one_of=include,
                better_than=best.key if best else None,
                node_floor=_node_floor(ctx.card, sharding, size),
                cost=cost_model(ctx.card, sharding, size),
            ).best
        else:
            found = _sweep(ctx, mode)[SHARDINGS.index(sharding)].get(size)
        if found is not None and (best is None or found.key < best.key):
            best = found
    if best is None:
        return None
    usable, shares = best.payload
    return _Plan(best.key, best.cycle, usable, tuple(shares))


def _cost_of(card: ModelCard, sharding: Sharding) -> Callable[[int], CostModel]:
    """Per ring size, the network cost model of ``card`` under ``sharding``."""
    return lambda size: cost_model(card, sharding, size)


def _node_floor(card: ModelCard, sharding: Sharding, size: int) -> int:
    """Usable bytes below which a node cannot take any rank: a tensor share (the same on
    every rank); for pipeline 0 (shares depend on the split)."""
    if sharding == "tensor":
        return tensor_share_bytes(card, size)
    return 0


def _used_addresses(state: State) -> set[str]:
    """Ring addresses (``ip:port``) taken by the shards of existing instances."""
    return {shard.ring_address for inst in state.instances.values() for shard in inst.shards if shard.ring_address}


def _first_port(instance_id: str) -> int:
    """Where an instance starts looking for ring ports: ``RING_BASE_PORT`` plus an offset
    derived from its id. A new instance (a re-placement, or a placement right after a
    deletion) thus rarely reuses the ports of the one before it, whose sockets the kernel
    may still hold (TIME_WAIT) — MLX's ring cannot bind a port in that state."""
    digest = hashlib.sha256(instance_id.encode()).digest()
    return RING_BASE_PORT + int.from_bytes(digest[:4], "big") % RING_PORT_SPAN


def _ring_ips(ctx: _Context, cycle: tuple[NodeId, ...], model: CostModel) -> list[tuple[str, bool]]:
    """Per rank, (the IP its ring predecessor reaches it at, whether that address was measured):
    the cheapest address of the link for the bytes the hop carries (rank 0's: the closing hop)."""
    out = []
    for rank in range(len(cycle)):
        link = ctx.topology.link(cycle[rank - 1], cycle[rank])
        assert link is not None  # the search only returns cycles of the topology
        path = link.best(model.close_bytes if rank == 0 else model.hop_bytes)
        out.append((path.ip, path.measured))
    return out


def _ring_addresses(ctx: _Context, cycle: tuple[NodeId, ...], instance_id: str, model: CostModel) -> list[str]:
    """Per rank, ``ip:port`` where the rank listens: the IP at which its ring predecessor
    reaches it (one address per link, the cheapest under ``model`` (``_ring_ips``), chosen
    here once, so both ranks of a link agree) and
    the first port from ``_first_port(instance_id)`` on (wrapping within
    ``[RING_BASE_PORT, RING_BASE_PORT + RING_PORT_SPAN)``) not used on that node by an
    existing instance, nor at that IP by any instance or an earlier rank of this one
    (several nodes can share an IP: processes on one machine)."""
    if len(cycle) == 1:
        return [""]
    taken = _used_addresses(ctx.state)
    out = []
    for rank, (ip, _) in enumerate(_ring_ips(ctx, cycle, model)):
        host = f"[{ip}]" if ":" in ip else ip
        node_ports = _used_ports(ctx.state, cycle[rank])
        start = _first_port(instance_id) - RING_BASE_PORT
        for step in range(RING_PORT_SPAN):
            port = RING_BASE_PORT + (start + step) % RING_PORT_SPAN
            if port not in node_ports and f"{host}:{port}" not in taken:
                break
        else:
            raise PlacementError(f"no free ring port on node {_label(ctx.state, cycle[rank])} at {ip}")
        address = f"{host}:{port}"
        taken.add(address)
        out.append(address)
    return out


def _used_ports(state: State, node: NodeId) -> set[int]:
    """Ports the shards of existing instances on ``node`` listen on (at any IP)."""
    ports: set[int] = set()
    for inst in state.instances.values():
        for shard in inst.shards:
            if shard.node_id == node and ":" in shard.ring_address:
                port = shard.ring_address.rsplit(":", 1)[1]
                if port.isdigit():
                    ports.add(int(port))
    return ports


def _instance(ctx: _Context, plan: _Plan, sharding: Sharding, instance_id: str) -> Instance:
    size = len(plan.cycle)
    addresses = _ring_addresses(ctx, plan.cycle, instance_id, cost_model(ctx.card, sharding, size))
    shards = tuple(
        ShardMetadata(
            node_id=node,
            runner_id=RunnerId(f"{instance_id}-r{rank}"),
            rank=rank,
            world_size=size,
            start_layer=share.start_layer,
            end_layer=share.end_layer,
            n_layers=ctx.card.n_layers,
            share_bytes=share.share_bytes,
            boot_id=ctx.state.nodes[node].boot_id,
            ring_address=addresses[rank],
            weights_dtype=share.weights_dtype,
        )
        for rank, (node, share) in enumerate(zip(plan.cycle, plan.shares, strict=True))
    )
    digest = fetch_source_digest(ctx.state, ctx.card.model_id) or ""
    return Instance(InstanceId(instance_id), ModelId(ctx.card.model_id), sharding, shards, model_digest=digest)


def _largest(ctx: _Context, sizes: list[int]) -> tuple[int, tuple[NodeId, ...], list[int]] | None:
    """The candidate cycle (any size in ``sizes``, either memory mode) with the most usable
    bytes, ignoring whether the model fits: (bytes, rank-order cycle, usable per rank)."""
    found: tuple[tuple[int, tuple[tuple[int, str], ...]], tuple[NodeId, ...], list[int]] | None = None
    for mode, (weights, include) in enumerate(_modes(ctx)):
        heaviest = sorted(weights.values(), reverse=True)
        for size in sorted(sizes, reverse=True):
            if found is not None and sum(heaviest[:size]) < -found[0][0]:
                break
            if ctx.exact:
                search = _search(ctx, mode, rank_links=False)[0]
                best = search.best(size, lambda cycle: True, required=ctx.required, include_one_of=include).best
            else:
                best = _sweep(ctx, mode)[len(SHARDINGS)].get(size)
            if best is not None:
                rank_key = (best.key[3], best.key[4])
                if found is None or rank_key < found[0]:
                    found = (rank_key, best.cycle, [weights[n] for n in best.cycle])
    if found is None:
        return None
    return -found[0][0], found[1], found[2]


def _explain(ctx: _Context, sharding: Sharding, min_size: int, sizes: list[int]) -> str:
    """Why no cycle of ``sizes`` nodes takes the model (sizes already tried and failed)."""
    state, card = ctx.state, ctx.card
    ok_sizes = [k for k in sizes if _size_problem(card, sharding, k) is None]
    if sizes and not ok_sizes:
        message = "; ".join(dict.fromkeys(p for k in sizes if (p := _size_problem(card, sharding, k))))
    else:
        largest = _largest(ctx, ok_sizes)
        need = required_bytes(card.storage_size)
        if largest is None:
            containing = f" containing {', '.join(_label(state, n) for n in sorted(ctx.required))}" if ctx.required else ""
            message = (
                f"no candidate cycle of {min_size} or more nodes{containing} among the "
                f"{len(ctx.eligible)} nodes that report memory and hold (or can fetch) model {card.model_id}"
            )
        else:
            total, cycle, usable = largest
            names = ", ".join(_label(state, n) for n in cycle)
            if total < need:
                message = (
                    f"needs {gib(need)} ({need} bytes: {gib(card.storage_size)} + 10%); "
                    f"the largest candidate cycle ({names}) has {gib(total)} ({total} bytes)"
                )
            else:
                over = _shares(card, sharding, usable, _policies(state, cycle))
                disk = None if isinstance(over, Overflow) else _disk_short(ctx, sharding, cycle, over)
                if disk is not None:
                    rank, fetch, need, have = disk
                    message = (
                        f"no candidate cycle has the disk for the shards it must fetch; on the largest "
                        f"candidate cycle ({names}) rank {rank} on {_label(state, cycle[rank])} would fetch "
                        f"{gib(fetch)} ({fetch} bytes) and needs {need} bytes free in its models dir "
                        f"but has {have} bytes"
                    )
                else:
                    assert isinstance(over, Overflow)
                    message = (
                        f"no candidate cycle holds every rank's share; on the largest candidate cycle ({names}) "
                        f"rank {over.rank} on {_label(state, cycle[over.rank])} needs {gib(over.need)} "
                        f"({over.need} bytes) but has {gib(over.have)} ({over.have} bytes)"
                    )
    notes = [f"{_label(state, n)}: {why}" for n, why in ctx.excluded.items()]
    notes += [f"no ring address from {_label(state, a)} to {_label(state, b)}" for a, b in ctx.topology.unaddressed]
    return message + "".join(f"; {note}" for note in notes)


def _preview(ctx: _Context, sharding: Sharding, size: int) -> Preview:
    def failed(reason: str) -> Preview:
        return Preview(sharding, size, error=reason)

    if ctx.blocking is not None:
        return failed(ctx.blocking)
    if sharding == "tensor" and not ctx.card.supports_tensor:
        return failed(f"model {ctx.card.model_id} does not support tensor sharding ({_family_problem(ctx.card, sharding)})")
    if size < len(ctx.required):
        return failed(f"{len(ctx.required)} nodes are required but the world size is {size}")
    problem = _size_problem(ctx.card, sharding, size)
    if problem is not None:
        return failed(problem)
    plan = _best_of_size(ctx, sharding, size) if size <= len(ctx.eligible) else None
    if plan is None:
        return failed(_explain(ctx, sharding, size, [size] if size <= len(ctx.eligible) else []))
    instance = _instance(ctx, plan, sharding, "preview")
    return Preview(
        sharding,
        size,
        instance,
        nodes=plan.cycle,
        bytes_per_node=tuple(s.share_bytes for s in plan.shares),
        layers_per_node=tuple(s.end_layer - s.start_layer for s in plan.shares),
        weights_per_node=tuple(s.weights_dtype for s in plan.shares),
        fetch_bytes_per_node=tuple(_fetch_bytes(ctx, sharding, plan.cycle, plan.shares)),
        network_us_per_token=plan.key[0],
        links_measured=all(measured for _, measured in _ring_ips(ctx, plan.cycle, cost_model(ctx.card, sharding, size)))
        if size > 1 else True,
    )
