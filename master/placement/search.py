"""The search of placement: the best fitting cycle of one size, and the largest candidate.

A cycle fits (``fits``) when every rank's share (``master.placement.split``) fits its node's
usable memory and every node that fetches the model has the disk for its bytes
(``master.placement.fetch``). Up to ``EXACT_SEARCH_MAX_NODES`` eligible nodes each (size,
memory mode) gets one exact branch and bound (``master.placement.branch_and_bound``); beyond,
one budgeted sweep per memory mode (``master.placement.cycle_sweep``, ``SWEEP_BUDGET``) serves
every size, both shardings and the error messages (``largest_candidate``). Rules: the
docstring of ``master.placement.place``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from master.placement.cost import CostModel, cost_model
from master.placement.branch_and_bound import branch_and_bound
from master.placement.cycle_order import CycleKey
from master.placement.cycle_search import Found
from master.placement.cycle_sweep import Goal, sweep
from exo_p2p.types import ModelCard, NodeId, Sharding, State
from master.placement.context import (
    SHARDINGS,
    PlacementContext,
    memory_modes,
    prepared_search,
    required_bytes,
    size_problem,
)
from master.placement.fetch import disk_problem, shard_fetch_bytes
from master.placement.split import Overflow, RankShare, pipeline_shares, tensor_share_bytes, tensor_shares

SWEEP_BUDGET = 8000
"""Successors examined by the one heuristic search per memory mode beyond ``EXACT_SEARCH_MAX_NODES``
(enough for the first full path of a mesh of up to ~89 nodes: n*n/2 within half the budget)."""


@dataclass(frozen=True)
class Plan:
    """A chosen cycle (rank order), its key, each rank's usable bytes and share."""

    key: CycleKey
    cycle: tuple[NodeId, ...]
    usable: tuple[int, ...]
    shares: tuple[RankShare, ...]


def rank_shares(card: ModelCard, sharding: Sharding, usable: list[int], policies: list[str] | None = None) -> list[RankShare] | Overflow:
    """Each rank's share of ``card`` under ``sharding`` given its usable bytes and weights
    policy, or the first rank it overflows (``master.placement.split``)."""
    if sharding == "tensor":
        return tensor_shares(card, usable, policies)
    return pipeline_shares(card, usable, policies)


def weight_policies(state: State, cycle: Iterable[NodeId]) -> list[str]:
    """Per rank, the weights its node's runners may hold (``NodeProfile.cpu_weights``)."""
    return [state.nodes[n].cpu_weights for n in cycle]


def fits(ctx: PlacementContext, sharding: Sharding, weights: dict[NodeId, int]) -> Callable[[tuple[NodeId, ...]], tuple[tuple[int, ...], list[RankShare]] | None]:
    """The search's ``accept``: (usable per rank, shares) when every rank's share fits, else None."""

    def accept(cycle: tuple[NodeId, ...]) -> tuple[tuple[int, ...], list[RankShare]] | None:
        usable = [weights[n] for n in cycle]
        shares = rank_shares(ctx.card, sharding, usable, weight_policies(ctx.state, cycle))
        if isinstance(shares, Overflow) or disk_short(ctx, sharding, cycle, shares) is not None:
            return None
        return tuple(usable), shares

    return accept


def fetch_bytes(ctx: PlacementContext, sharding: Sharding, cycle: tuple[NodeId, ...], shares: Iterable[RankShare]) -> list[int]:
    """Per rank, the stored bytes its node fetches from peers (0: it holds the model)."""
    return [
        shard_fetch_bytes(ctx.card, sharding, rank, len(cycle), share.start_layer, share.end_layer)
        if node in ctx.fetchers else 0
        for rank, (node, share) in enumerate(zip(cycle, shares, strict=True))
    ]


def disk_short(ctx: PlacementContext, sharding: Sharding, cycle: tuple[NodeId, ...], shares: Iterable[RankShare]) -> tuple[int, int, int, int] | None:
    """``(rank, fetch, need, have)`` of the first rank whose node lacks the disk for the
    bytes it fetches (bytes), or None."""
    for rank, fetch in enumerate(fetch_bytes(ctx, sharding, cycle, shares)):
        short = disk_problem(ctx.state, cycle[rank], fetch)
        if short is not None:
            return rank, fetch, *short
    return None


def sweep_records(ctx: PlacementContext, mode: int) -> list[dict[int, Found]]:
    """The heuristic's records of memory mode ``mode`` (beyond ``EXACT_SEARCH_MAX_NODES``),
    cached: per length, the best fitting cycle for each of ``SHARDINGS``, then the heaviest."""
    if mode not in ctx.sweeps:
        search, (weights, include) = prepared_search(ctx, mode)
        lengths = range(1, len(ctx.eligible) + 1)
        goals: list[Goal] = [
            Goal(
                fits(ctx, sharding, weights),
                frozenset(k for k in lengths if size_problem(ctx.card, sharding, k) is None)
                if sharding == "pipeline" or ctx.card.supports_tensor else frozenset(),
                required_bytes(ctx.card.storage_size),
                cost=cost_of(ctx.card, sharding),
            )
            for sharding in SHARDINGS
        ]
        goals.append(Goal(lambda cycle: True, frozenset(lengths), rank_links=False))
        ctx.sweeps[mode] = sweep(search, goals, required=ctx.required, include_one_of=include, budget=SWEEP_BUDGET)
    return ctx.sweeps[mode]


def best_of_size(ctx: PlacementContext, sharding: Sharding, size: int) -> Plan | None:
    """The best fitting cycle of exactly ``size`` nodes, or None (exact search or the
    heuristic's record; ``master.placement.place`` docstring "Scale")."""
    best: Found | None = None
    for mode in range(len(memory_modes(ctx))):
        if ctx.exact:
            search, (weights, include) = prepared_search(ctx, mode)
            found = branch_and_bound(
                search,
                size,
                fits(ctx, sharding, weights),
                min_weight=required_bytes(ctx.card.storage_size),
                required=ctx.required,
                include_one_of=include,
                better_than=best.key if best else None,
                node_floor=node_floor(ctx.card, sharding, size),
                cost=cost_model(ctx.card, sharding, size),
            ).best
        else:
            found = sweep_records(ctx, mode)[SHARDINGS.index(sharding)].get(size)
        if found is not None and (best is None or found.key < best.key):
            best = found
    if best is None:
        return None
    usable, shares = best.payload
    return Plan(best.key, best.cycle, usable, tuple(shares))


def cost_of(card: ModelCard, sharding: Sharding) -> Callable[[int], CostModel]:
    """Per ring size, the network cost model of ``card`` under ``sharding``."""
    return lambda size: cost_model(card, sharding, size)


def node_floor(card: ModelCard, sharding: Sharding, size: int) -> int:
    """Usable bytes below which a node cannot take any rank: a tensor share (the same on
    every rank); for pipeline 0 (shares depend on the split)."""
    if sharding == "tensor":
        return tensor_share_bytes(card, size)
    return 0


def largest_candidate(ctx: PlacementContext, sizes: list[int]) -> tuple[int, tuple[NodeId, ...], list[int]] | None:
    """The candidate cycle (any size in ``sizes``, either memory mode) with the most usable
    bytes, ignoring whether the model fits: (bytes, rank-order cycle, usable per rank)."""
    found: tuple[tuple[int, tuple[tuple[int, str], ...]], tuple[NodeId, ...], list[int]] | None = None
    for mode, (weights, include) in enumerate(memory_modes(ctx)):
        heaviest = sorted(weights.values(), reverse=True)
        for size in sorted(sizes, reverse=True):
            if found is not None and sum(heaviest[:size]) < -found[0][0]:
                break
            if ctx.exact:
                search = prepared_search(ctx, mode, rank_links=False)[0]
                best = branch_and_bound(search, size, lambda cycle: True, required=ctx.required, include_one_of=include).best
            else:
                best = sweep_records(ctx, mode)[len(SHARDINGS)].get(size)
            if best is not None:
                rank_key = (best.key[3], best.key[4])
                if found is None or rank_key < found[0]:
                    found = (rank_key, best.cycle, [weights[n] for n in best.cycle])
    if found is None:
        return None
    return -found[0][0], found[1], found[2]
