"""The search of placement: the best fitting cycle of one size, and the largest candidate.

A cycle fits (``fits``) when every rank's share (``master.placement.split``) fits its node's
usable memory and every node that fetches the model has the disk for its bytes
(``master.placement.fetch``). The memory of a node is counted in two modes
(``memory_modes``). One ``Search`` is made per request (``master/placement/place.py``: one
for ``place_instance``, one for all the previews of ``placement_previews``) and lives as long
as it: it prepares each mode's ``CycleSearch`` once and, beyond ``EXACT_SEARCH_MAX_NODES``,
runs one budgeted sweep per memory mode (``master.placement.cycle_sweep``, ``SWEEP_BUDGET``)
that serves every size, both shardings and the error messages (``largest_candidate``); up to
it each (size, memory mode) gets one exact branch and bound
(``master.placement.branch_and_bound``). The request's ``PlacementContext`` is read, never
written. Rules: the docstring of ``master/placement/place.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from exo_p2p.types import ModelCard, NodeId, Sharding, State
from master.placement.branch_and_bound import branch_and_bound
from master.placement.context import SHARDINGS, PlacementContext, required_bytes, size_problem
from master.placement.cost import CostModel, cost_model
from master.placement.cycle_order import CycleKey
from master.placement.cycle_search import CycleSearch, Found
from master.placement.cycle_sweep import Goal, sweep
from master.placement.fetch import disk_problem, shard_fetch_bytes
from master.placement.memory import usable_memory
from master.placement.speed_split import SplitChoice, best_rotation
from master.placement.split import Overflow, RankShare, pipeline_shares, tensor_share_bytes, tensor_shares

SWEEP_BUDGET = 8000
"""Successors examined by the one heuristic search per memory mode beyond ``EXACT_SEARCH_MAX_NODES``
(enough for the first full path of a mesh of up to ~89 nodes: n*n/2 within half the budget)."""
Mode = tuple[dict[NodeId, int], frozenset[NodeId] | None]
"""A memory mode: (usable bytes per eligible node, the nodes a cycle must include one of, or None)."""


@dataclass(frozen=True)
class Plan:
    """A chosen cycle (rank order), its key, each rank's usable bytes and share."""

    key: CycleKey
    cycle: tuple[NodeId, ...]
    usable: tuple[int, ...]
    shares: tuple[RankShare, ...]
    choice: SplitChoice | None = None
    """The speed split's estimates and reason (pipeline, ≥ 2 ranks, every rank's speed known)."""


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


def memory_modes(ctx: PlacementContext) -> tuple[Mode, ...]:
    """(weights = usable bytes, must include one of) for the two memory modes: cycles with no
    node hosting an instance count total memory; cycles with one count available memory as
    State sees it (``master.placement.memory.usable_memory``)."""
    profiles = ctx.state.nodes
    free = {n: profiles[n].memory_total or 0 for n in ctx.eligible if n not in ctx.hosts}
    hosts = frozenset(n for n in ctx.eligible if n in ctx.hosts)
    if not hosts:
        return ((free, None),)
    return (free, None), ({n: usable_memory(ctx.state, n) or 0 for n in ctx.eligible}, hosts)


class Search:
    """The search of one placement request over ``ctx`` (module docstring); made per request.

    Memoises, for the request's life only, each memory mode's prepared ``CycleSearch`` and,
    beyond ``EXACT_SEARCH_MAX_NODES``, each mode's sweep records, so the previews of every
    (sharding, size) and the error messages share one sweep. Nothing is kept on ``ctx``."""

    def __init__(self, ctx: PlacementContext, split: str = "speed") -> None:
        self.ctx, self.split = ctx, split
        self.modes = memory_modes(ctx)
        self._prepared: dict[tuple[int, bool], CycleSearch] = {}
        self._sweeps: dict[int, list[dict[int, Found]]] = {}

    def prepared(self, mode: int, rank_links: bool = True) -> CycleSearch:
        """The prepared cycle search of memory mode ``mode`` (index into ``modes``)."""
        key = (mode, rank_links)
        if key not in self._prepared:
            self._prepared[key] = CycleSearch(self.ctx.topology, self.modes[mode][0], rank_links=rank_links)
        return self._prepared[key]

    def sweep_records(self, mode: int) -> list[dict[int, Found]]:
        """The heuristic's records of memory mode ``mode`` (beyond ``EXACT_SEARCH_MAX_NODES``):
        per length, the best fitting cycle for each of ``SHARDINGS``, then the heaviest."""
        if mode not in self._sweeps:
            ctx, (weights, include) = self.ctx, self.modes[mode]
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
            self._sweeps[mode] = sweep(self.prepared(mode), goals, required=ctx.required, include_one_of=include, budget=SWEEP_BUDGET)
        return self._sweeps[mode]

    def best_of_size(self, sharding: Sharding, size: int) -> Plan | None:
        """The best fitting cycle of exactly ``size`` nodes, or None (exact search or the
        heuristic's record; ``master/placement/place.py`` docstring "Scale")."""
        ctx = self.ctx
        best: Found | None = None
        for mode, (weights, include) in enumerate(self.modes):
            if ctx.exact:
                found = branch_and_bound(
                    self.prepared(mode),
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
                found = self.sweep_records(mode)[SHARDINGS.index(sharding)].get(size)
            if found is not None and (best is None or found.key < best.key):
                best = found
        if best is None:
            return None
        usable, shares = best.payload
        plan = Plan(best.key, best.cycle, usable, tuple(shares))
        if sharding != "pipeline" or self.split != "speed":
            return plan
        fast = by_speed(ctx.state, ctx.card, plan)  # a fetching node must have the disk for its new share
        return fast if disk_short(ctx, sharding, fast.cycle, fast.shares) is None else plan

    def largest_candidate(self, sizes: list[int]) -> tuple[int, tuple[NodeId, ...], list[int]] | None:
        """The candidate cycle (any size in ``sizes``, either memory mode) with the most usable
        bytes, ignoring whether the model fits: (bytes, rank-order cycle, usable per rank)."""
        found: tuple[tuple[int, tuple[tuple[int, str], ...]], tuple[NodeId, ...], list[int]] | None = None
        for mode, (weights, include) in enumerate(self.modes):
            heaviest = sorted(weights.values(), reverse=True)
            for size in sorted(sizes, reverse=True):
                if found is not None and sum(heaviest[:size]) < -found[0][0]:
                    break
                if self.ctx.exact:
                    search = self.prepared(mode, rank_links=False)
                    best = branch_and_bound(search, size, lambda cycle: True, required=self.ctx.required, include_one_of=include).best
                else:
                    best = self.sweep_records(mode)[len(SHARDINGS)].get(size)
                if best is not None:
                    rank_key = (best.key[3], best.key[4])
                    if found is None or rank_key < found[0]:
                        found = (rank_key, best.cycle, [weights[n] for n in best.cycle])
        if found is None:
            return None
        return -found[0][0], found[1], found[2]


def micro_batches(state: State, cycle: tuple[NodeId, ...]) -> int:
    """The micro-batches the ranks of ``cycle`` will use (``worker.engine.micro.auto_micro_batches``):
    as many as ranks when no two of its nodes share an address (hosts of their own), else 1."""
    seen: set[str] = set()
    for node in cycle:
        ips = {a.ip for a in state.nodes[node].addrs}
        if not ips or ips & seen:
            return 1
        seen |= ips
    return len(cycle)


def by_speed(state: State, card: ModelCard, plan: Plan) -> Plan:
    """``plan`` with its pipeline layers split by the nodes' measured speed, rank 0 possibly
    moved along the cycle (``master.placement.speed_split.best_rotation``: the last rank carries
    the output head); unchanged when a rank's speed is unknown or no split gains enough."""
    size = len(plan.cycle)
    rotations = []
    for i in range(size):
        cycle = plan.cycle[i:] + plan.cycle[:i]
        usable = plan.usable[i:] + plan.usable[:i]
        memory = plan.shares if i == 0 else pipeline_shares(card, list(usable), weight_policies(state, cycle))
        speeds = tuple(state.nodes[n].speed for n in cycle)
        rotations.append(None if isinstance(memory, Overflow) else (usable, tuple(memory), speeds))
    found = best_rotation(card, rotations, micro_batches(state, plan.cycle), plan.key[0])
    if found is None:
        return plan
    i, choice = found
    return Plan(plan.key, plan.cycle[i:] + plan.cycle[:i], plan.usable[i:] + plan.usable[:i], choice.shares, choice)


def cost_of(card: ModelCard, sharding: Sharding) -> Callable[[int], CostModel]:
    """Per ring size, the network cost model of ``card`` under ``sharding``."""
    return lambda size: cost_model(card, sharding, size)


def node_floor(card: ModelCard, sharding: Sharding, size: int) -> int:
    """Usable bytes below which a node cannot take any rank: a tensor share (the same on
    every rank); for pipeline 0 (shares depend on the split)."""
    if sharding == "tensor":
        return tensor_share_bytes(card, size)
    return 0
