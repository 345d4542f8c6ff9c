"""A pipeline split by measured speed: layer ranges that minimise the estimated time per token
(docs/placement-speed.md). Pure functions; no State.

**Stage cost.** Rank r of a pipeline over layers ``[s, e)`` reads, per decoded token, the
bytes of its layers and, on the last rank, of the final norm and the output head (for
SmolLM2 the tied head is ~8 layers' bytes); rank 0's embedding is a row lookup and costs
nothing. Its time is those bytes (KiB) × the node's ``NodeSpeed.decode_ns_per_kib`` (per
token of a prefill: ``prefill_ns_per_kib``).

**Time per token** of a step over ``m`` micro-batches (``worker.engine.micro``: m = ranks when
every rank has a host of its own, else 1): ``(Σ stages + (m − 1) × max stage) ÷ m`` plus the
ring's network cost (``master.placement.cost``; it does not depend on the split). m = 1 (ranks
take turns, one stream) is the sum; many micro-batches tend to the slowest stage.

**Choice.** Among splits where every rank has ≥ 1 layer and its share fits its usable memory
with the 10 % headroom (``split.headroom_bytes``), the one of least decode estimate; it
replaces the memory-proportional split (``split.pipeline_shares``) only when it is at least
``MIN_GAIN`` faster by the estimate, so equal nodes, noise and ties keep today's split, and
the chosen split is never slower by the estimate than the memory one. Nodes whose speeds are
within ``EQUAL_SPEED`` of each other count as equal and keep it too. The prefill estimate
is reported beside it (a split is chosen by decode: generation dominates a chat's time).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from exo_p2p.types import ModelCard, NodeSpeed
from master.placement.split import RankShare, headroom_bytes, non_layer_bytes_of_rank

MIN_GAIN = 0.10
"""The least relative gain (by the decode estimate) for which the speed split replaces the
memory-proportional one (like ``master.relink``'s gain rule for links)."""

SPEED_BOUNDS = {"decode_ns_per_kib": (1, 10_000_000), "prefill_ns_per_kib": (1, 10_000_000), "mem_mib_per_s": (1, 10_000_000)}
"""Accepted range of each ``NodeSpeed`` figure (inclusive); outside it the figure is absurd
and dropped (``valid_speed``): 1 ns/KiB is ~1 TB/s, 10 ms/KiB a machine 10⁵× slower than a laptop."""

EQUAL_SPEED = 1.3
"""Nodes whose decode figures are all within this ratio are equal (the calibration's noise
band, ``worker.calibrate.run.SPEED_MOVE``): their cycle keeps today's memory split."""

ROTATE_MAX_RANKS = 4
"""Cycles of at most this many ranks also try moving rank 0 (``best_rotation``); larger ones
keep the memory rule's rank 0 (each rotation is one more search)."""

CAPS = 24
"""Caps on the slowest stage tried when m > 1 (``best_split``): bounds the search's work."""


def valid_speed(speed: NodeSpeed | None) -> bool:
    """Whether ``speed`` is usable: present, every figure an int within ``SPEED_BOUNDS``."""
    if speed is None:
        return False
    for name, (low, high) in SPEED_BOUNDS.items():
        value = getattr(speed, name, None)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            return False
    return True


@dataclass(frozen=True)
class SplitChoice:
    """The split chosen for a cycle: ``shares`` in rank order, the estimates (µs per token,
    network included) of the chosen and of the memory-proportional split, and ``reason``."""

    shares: tuple[RankShare, ...]
    decode_us: int
    prefill_us: int
    memory_decode_us: int
    reason: str


def stage_work_kib(card: ModelCard, rank: int, world: int, start: int, end: int) -> float:
    """KiB a rank over layers ``[start, end)`` reads per token (module docstring, "Stage cost");
    ``card`` sized for the weights the rank holds."""
    extra = card.last_rank_extra_bytes() if rank == world - 1 else 0
    return (sum(card.layer_bytes[start:end]) + extra) / 1024


def step_us(stages: list[float], micro: int, network_us: int) -> int:
    """Time per token (µs) of stage times ``stages`` over ``micro`` micro-batches plus ``network_us``."""
    m = max(1, micro)
    return int((sum(stages) + (m - 1) * max(stages)) / m) + network_us


def estimate(card: ModelCard, shares: tuple[RankShare, ...], speeds: tuple[NodeSpeed, ...], micro: int,
             network_us: int, kind: str = "decode") -> int:
    """The estimated µs per token of ``shares`` (``kind``: ``"decode"`` or ``"prefill"``)."""
    world = len(shares)
    stages = []
    for r, sh in enumerate(shares):
        ns = speeds[r].decode_ns_per_kib if kind == "decode" else speeds[r].prefill_ns_per_kib
        stages.append(stage_work_kib(card.sized_for(sh.weights_dtype), r, world, sh.start_layer, sh.end_layer) * ns / 1000)
    return step_us(stages, 1 if kind == "prefill" else micro, network_us)


def _share(card: ModelCard, rank: int, world: int, start: int, end: int, dtype: str) -> RankShare:
    sized = card.sized_for(dtype)
    return RankShare(start, end, non_layer_bytes_of_rank(sized, rank, world, "pipeline") + sum(sized.layer_bytes[start:end]), dtype)


@lru_cache(maxsize=256)
def best_split(card: ModelCard, usable: tuple[int, ...], dtypes: tuple[str, ...], speeds: tuple[NodeSpeed, ...],
               micro: int) -> tuple[tuple[int, ...], float] | None:
    """Layer counts per rank of least decode time (network excluded) under the memory rule, and
    that time (µs); None when no split fits. m = 1: one dynamic programme minimising the sum
    of stages; m > 1: the same under each of ``CAPS`` caps on the slowest stage, keeping the
    least ``step_us``. Work: O(CAPS × ranks × layers²)."""
    world, n = len(usable), card.n_layers
    cost = [[[0.0] * (n + 1) for _ in range(n + 1)] for _ in range(world)]
    ok = [[[False] * (n + 1) for _ in range(n + 1)] for _ in range(world)]
    for r in range(world):
        sized = card.sized_for(dtypes[r])
        prefix = [0]
        for b in sized.layer_bytes:
            prefix.append(prefix[-1] + b)
        fixed = non_layer_bytes_of_rank(sized, r, world, "pipeline")
        extra = sized.last_rank_extra_bytes() if r == world - 1 else 0
        for s in range(n):
            for e in range(s + 1, n + 1):
                layers = prefix[e] - prefix[s]
                ok[r][s][e] = headroom_bytes(fixed + layers) <= usable[r]
                cost[r][s][e] = (layers + extra) / 1024 * speeds[r].decode_ns_per_kib / 1000
    caps = [float("inf")]
    if micro > 1:
        top = max(cost[r][0][n] for r in range(world))
        caps += [top * (k + 1) / CAPS for k in range(CAPS)]
    best: tuple[tuple[int, ...], float] | None = None
    for cap in caps:
        counts = _min_sum(cost, ok, world, n, cap)
        if counts is None:
            continue
        stages, start = [], 0
        for r, c in enumerate(counts):
            stages.append(cost[r][start][start + c])
            start += c
        total = (sum(stages) + (max(1, micro) - 1) * max(stages)) / max(1, micro)
        if best is None or total < best[1] - 1e-9:
            best = (counts, total)
    return best


def _min_sum(cost: list, ok: list, world: int, n: int, cap: float) -> tuple[int, ...] | None:
    """Layer counts minimising Σ stage cost with every stage fitting (``ok``) and ≤ ``cap``;
    among sums equal to 0.001 µs, the least slowest stage so far (equal nodes share evenly)."""
    inf = (float("inf"), float("inf"))
    dp = [[inf] * (n + 1) for _ in range(world + 1)]
    back = [[0] * (n + 1) for _ in range(world + 1)]
    dp[0][0] = (0.0, 0.0)
    for r in range(world):
        for e in range(r + 1, n - (world - r - 1) + 1):
            for s in range(r, e):
                c = cost[r][s][e]
                if dp[r][s] is inf or not ok[r][s][e] or c > cap:
                    continue
                key = (round(dp[r][s][0] + c, 3), max(dp[r][s][1], c))
                if key < dp[r + 1][e]:
                    dp[r + 1][e], back[r + 1][e] = key, s
    if dp[world][n] is inf:
        return None
    counts, e = [], n
    for r in range(world, 0, -1):
        s = back[r][e]
        counts.append(e - s)
        e = s
    return tuple(reversed(counts))


def speed_shares(card: ModelCard, usable: tuple[int, ...], memory: tuple[RankShare, ...], speeds: tuple[NodeSpeed | None, ...],
                 micro: int, network_us: int) -> SplitChoice | None:
    """The split of a pipeline cycle by speed (module docstring, "Choice"), given the
    memory-proportional ``memory`` shares (their weights per rank are kept). None when a rank
    has no valid speed (``valid_speed``) or the cycle is one node: the memory split stands."""
    world = len(memory)
    if world < 2 or not all(valid_speed(s) for s in speeds):
        return None
    known = tuple(s for s in speeds if s is not None)
    dtypes = tuple(sh.weights_dtype for sh in memory)
    mem_us = estimate(card, memory, known, micro, network_us)
    figures = [s.decode_ns_per_kib for s in known]
    found = best_split(card, usable, dtypes, known, micro) if max(figures) > EQUAL_SPEED * min(figures) else None
    if found is not None:
        shares, start = [], 0
        for r, c in enumerate(found[0]):
            shares.append(_share(card, r, world, start, start + c, dtypes[r]))
            start += c
        fast = estimate(card, tuple(shares), known, micro, network_us)
        if fast <= mem_us * (1 - MIN_GAIN):
            reason = f"by speed: {fast} µs/token against {mem_us} for the memory-proportional split"
            return SplitChoice(tuple(shares), fast, estimate(card, tuple(shares), known, micro, network_us, "prefill"), mem_us, reason)
    reason = (f"memory-proportional: no split is {int(MIN_GAIN * 100)} % faster by the estimate ({mem_us} µs/token)"
              if found is not None else f"memory-proportional: the nodes' speeds are within {int(EQUAL_SPEED * 100 - 100)} %")
    return SplitChoice(memory, mem_us, estimate(card, memory, known, micro, network_us, "prefill"), mem_us, reason)


def best_rotation(card: ModelCard, rotations: list[tuple[tuple[int, ...], tuple[RankShare, ...], tuple[NodeSpeed | None, ...]] | None],
                  micro: int, network_us: int) -> tuple[int, SplitChoice] | None:
    """The rotation of a cycle (which node is rank 0, so which carries the output head) whose
    speed split is fastest: ``rotations[i]`` is (usable, memory-proportional shares, speeds)
    with rank 0 the cycle's i-th node, None where the memory split does not fit; rotation 0
    is the memory rule's order, whose memory split is the baseline. Another rotation is taken
    only when its split is at least ``MIN_GAIN`` faster than that baseline and faster than
    rotation 0's choice. None when rotation 0 has no speed split (``speed_shares``)."""
    if not rotations or rotations[0] is None:
        return None
    base = speed_shares(card, *rotations[0], micro, network_us)
    if base is None:
        return None
    best = (0, base)
    for i, rotation in enumerate(rotations[1:ROTATE_MAX_RANKS] if len(rotations) <= ROTATE_MAX_RANKS else [], start=1):
        choice = speed_shares(card, *rotation, micro, network_us) if rotation is not None else None
        if choice is None or choice.decode_us > base.memory_decode_us * (1 - MIN_GAIN) or choice.decode_us >= best[1].decode_us:
            continue
        reason = (f"by speed, rank 0 moved to the cycle's node {i}: {choice.decode_us} µs/token against "
                  f"{base.memory_decode_us} for the memory-proportional split")
        best = (i, SplitChoice(choice.shares, choice.decode_us, choice.prefill_us, base.memory_decode_us, reason))
    return best
