"""Placement: choose a cycle of nodes and a shard per node for a model (docs/architecture.md#rules).

Pure functions of ``State`` and a ``ModelCard``; no I/O, no clock, no randomness: the same input
always gives the same ``Instance``.

Rules, in the order they are applied:

- **Candidates** are simple cycles of the topology (``master.placement.topology``; a single node is
  a cycle) with ``len >= min_nodes``, containing every required node, in which every node
  reports its memory (``memory_total`` and ``memory_available`` not None — never counted as 0)
  and holds the model (``model_id`` in ``NodeProfile.models``) or may fetch it from peers
  (``master.placement.fetch``: some node publishes a complete copy and the node reports its
  free disk), and every link of the ring has an address (an edge without one does not count).
  A rank on a node that fetches needs the disk for its shard's bytes
  (``master.placement.fetch.disk_problem``); a cycle where one does not have it is not taken. A node holding other files under the
  model's name than most holders (another manifest digest, ``master.model_identity``) is
  not a candidate: placement never mixes two models that share a name.
- **Memory**: ``sum(usable) >= 1.1 * storage_size``, computed exactly as
  ``sum(usable) >= required_bytes(storage_size) = ceil(storage_size * 11 / 10)`` (for an
  integer sum the two are the same). ``usable(n)`` is ``memory_total`` when no node of the
  cycle hosts a shard of an instance in ``state.instances``, else ``master.placement.memory.usable_memory``:
  ``min(memory_available, memory_total − Σ share_bytes State places on n)``, so a placement
  counts the moment it is indexed, not when the node re-reports its memory.
- **Choice order** among candidates (see ``master.placement.cycle_order.cycle_key``): (1) fewest nodes, (2) the
  least estimated network cost per token of the ring (``master.placement.cost``: per hop RTT +
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
  follow the cycle's direction from there. Shares: ``master.placement.split``.
- **Weights per rank**: each node's profile says what its runners may hold
  (``cpu_weights``: auto / float32 / stored; a Metal node and an old profile say stored). An
  auto rank holds float32 when its float32 share fits its usable memory with the 10%
  headroom, else the stored weights; the shard records it (``weights_dtype``) and its
  ``share_bytes`` are in those bytes (``master.placement.split.pipeline_shares``).
- **Ring addresses** (world size > 1): rank r listens at ``ip:port`` where ``ip`` is the
  cheapest address of the link (rank r-1 → rank r) for the bytes that hop carries
  (``Link.best``: measured figures first, else the edge's address) — the address at which its
  ring neighbour reaches it, chosen once here so both neighbours see the same — and ``port`` is the lowest port >=
  ``RING_BASE_PORT`` that no shard of an existing instance uses on that node, nor any shard (or
  an earlier rank of this instance) at that IP (several nodes may share one machine).
- **Scale**: up to ``EXACT_SEARCH_MAX_NODES`` eligible nodes the search is exact: one branch and
  bound per (size, memory mode), ``master.placement.branch_and_bound``. Beyond, one heuristic search per memory
  mode serves every size, both shardings and the error messages: ``master.placement.cycle_sweep``, a
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

Where each part lives (all in ``master/placement/``): the request's context and its errors
in ``master.placement.context`` (a frozen record, read once per request), the search in
``master.placement.search`` (one ``Search`` per request: ``place_instance`` makes one, and
``placement_previews`` one for all its previews), ring addresses in
``master.placement.ring``, the messages of failures in ``master.placement.explain``; this
module builds the ``Instance`` and the previews.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from exo_p2p.types import Instance, InstanceId, ModelCard, ModelId, NodeId, RunnerId, ShardMetadata, Sharding, State
from master.placement.context import (
    SHARDINGS,
    PlacementContext,
    PlacementError,
    family_problem,
    placement_context,
    size_problem,
)
from master.placement.cost import cost_model
from master.placement.explain import explain
from master.placement.fetch import fetch_source_digest
from master.placement.ring import ring_addresses, ring_ips
from master.placement.search import Plan, Search, fetch_bytes

SPLITS = ("speed", "memory")
"""How a pipeline's layers are split (``place_instance``'s ``split``)."""

__all__ = ["PlacementError", "Preview", "place_instance", "placement_previews"]
"""``PlacementError`` (defined in ``master.placement.context``) is part of this module's
interface: every caller of ``place_instance`` catches it."""


class Preview(msgspec.Struct, frozen=True):
    """The best placement for one (sharding, world size), or why there is none.

    ``instance`` is exactly what ``place_instance(..., min_nodes=world_size)`` returns for the
    same inputs (instance id ``"preview"``). ``nodes``, ``bytes_per_node`` (bytes each rank
    loads, in the weights it holds), ``layers_per_node``, ``weights_per_node`` (``"stored"``
    or ``"float32"``) and ``fetch_bytes_per_node`` (stored bytes the rank's node fetches from
    peers first, 0 when it holds the model; ``master.placement.fetch``) are in rank order;
    empty when ``error`` is set. ``network_us_per_token`` is the ring's estimated network cost
    per decoded token in microseconds (``master.placement.cost``; 0 for one node) and
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
    decode_us_per_token: int | None = None
    """Estimated µs per decoded token, network included (``master.placement.speed_split``;
    None: some rank's speed is unknown, or one node)."""
    prefill_us_per_token: int | None = None
    """Estimated µs per prompt token of a prefill by the same split."""
    memory_split_us_per_token: int | None = None
    """The decode estimate of the memory-proportional split of the same cycle."""
    split_reason: str = ""
    """Why the layers are split as they are (by speed, or memory-proportional and why)."""


def place_instance(
    state: State,
    model_card: ModelCard,
    *,
    min_nodes: int = 1,
    sharding: Sharding = "pipeline",
    nodes: Iterable[str] | None = None,
    instance_id: str = "preview",
    split: str = "speed",
) -> Instance:
    """The best placement of ``model_card`` on ``state``'s cluster (rules: module docstring).

    ``nodes``: names (``master.placement.context.resolve_nodes``) of nodes the placement must include. The instance's
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
    ctx = placement_context(state, model_card, nodes)
    if ctx.blocking is not None:
        raise PlacementError(ctx.blocking)
    if sharding == "tensor" and not model_card.supports_tensor:
        raise PlacementError(f"model {model_card.model_id} does not support tensor sharding ({family_problem(model_card, sharding)})")
    if split not in SPLITS:
        raise PlacementError(f"unknown split {split!r}; use speed or memory")
    search = Search(ctx, split)
    sizes = range(max(min_nodes, len(ctx.required)), len(ctx.eligible) + 1)
    for size in sizes:
        if size_problem(model_card, sharding, size) is not None:
            continue
        plan = search.best_of_size(sharding, size)
        if plan is not None:
            return _instance(ctx, plan, sharding, instance_id)
    raise PlacementError(explain(search, sharding, max(min_nodes, len(ctx.required)), list(sizes)))


def placement_previews(state: State, model_card: ModelCard, *, nodes: Iterable[str] | None = None) -> list[Preview]:
    """One ``Preview`` per (sharding, world size) for world sizes 1..len(state.nodes),
    pipeline first. Each is the best placement of exactly that size — identical to
    ``place_instance(state, model_card, min_nodes=world_size, sharding=..., nodes=nodes)`` —
    or the reason there is none. Raises ``PlacementError`` only for unknown/ambiguous names."""
    search = Search(placement_context(state, model_card, nodes))  # one search serves every preview
    previews: list[Preview] = []
    for sharding in SHARDINGS:
        for size in range(1, len(state.nodes) + 1):
            previews.append(_preview(search, sharding, size))
    return previews


def _instance(ctx: PlacementContext, plan: Plan, sharding: Sharding, instance_id: str) -> Instance:
    """The ``Instance`` of ``plan``: one shard per rank (layers, share bytes, weights, ring
    address), runner ids ``f"{instance_id}-r{rank}"``, the digest of the copy fetchers take."""
    size = len(plan.cycle)
    addresses = ring_addresses(ctx.state, ctx.topology, plan.cycle, instance_id, cost_model(ctx.card, sharding, size))
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


def _preview(search: Search, sharding: Sharding, size: int) -> Preview:
    """The ``Preview`` of exactly ``size`` nodes under ``sharding`` by the request's ``search``:
    the same checks, in the same order, as ``place_instance`` with ``min_nodes=size``."""
    ctx = search.ctx

    def failed(reason: str) -> Preview:
        return Preview(sharding, size, error=reason)

    if ctx.blocking is not None:
        return failed(ctx.blocking)
    if sharding == "tensor" and not ctx.card.supports_tensor:
        return failed(f"model {ctx.card.model_id} does not support tensor sharding ({family_problem(ctx.card, sharding)})")
    if size < len(ctx.required):
        return failed(f"{len(ctx.required)} nodes are required but the world size is {size}")
    problem = size_problem(ctx.card, sharding, size)
    if problem is not None:
        return failed(problem)
    plan = search.best_of_size(sharding, size) if size <= len(ctx.eligible) else None
    if plan is None:
        return failed(explain(search, sharding, size, [size] if size <= len(ctx.eligible) else []))
    instance = _instance(ctx, plan, sharding, "preview")
    return Preview(
        sharding,
        size,
        instance,
        nodes=plan.cycle,
        bytes_per_node=tuple(s.share_bytes for s in plan.shares),
        layers_per_node=tuple(s.end_layer - s.start_layer for s in plan.shares),
        weights_per_node=tuple(s.weights_dtype for s in plan.shares),
        fetch_bytes_per_node=tuple(fetch_bytes(ctx, sharding, plan.cycle, plan.shares)),
        network_us_per_token=plan.key[0],
        links_measured=all(measured for _, measured in ring_ips(ctx.topology, plan.cycle, cost_model(ctx.card, sharding, size)))
        if size > 1 else True,
        decode_us_per_token=plan.choice.decode_us if plan.choice else None,
        prefill_us_per_token=plan.choice.prefill_us if plan.choice else None,
        memory_split_us_per_token=plan.choice.memory_decode_us if plan.choice else None,
        split_reason=plan.choice.reason if plan.choice else "",
    )
