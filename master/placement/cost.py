"""The estimated network cost of a ring per decoded token, from link figures (docs/links.md).

Pure functions; placement ranks cycles by ``ring_cost_us`` (``master.placement.place``) and shows it
in previews. Units: microseconds per token, bytes, bytes per second.

**A hop** (one address of a link a→b) costs ``rtt_us + bytes × 10⁶ ÷ bytes_per_s`` for the
``bytes`` it carries per token (``hop_cost_us``). An unmeasured address (or one whose bandwidth
is not measured yet) takes the figures ``ASSUMED`` for its interface type: the static rank of
interfaces (Thunderbolt > Ethernet > Wi-Fi > other) is the fallback while a link is
unmeasured, and stays the tie-break between equal costs (``master.placement.cycle_order``). A link
with several addresses costs what its cheapest address costs, and the ring uses that address.

**A ring** of ``n`` ranks, per token (``CostModel``, built by ``cost_model``):

- pipeline: rank r sends the hidden state ``[1, 1, hidden]`` to rank r+1 (``hidden_size ×
  activation bytes``, 4 when the card does not say), and the last rank's token reaches every
  rank through an all-sum of one int32 over the ring (``worker.engine.pipeline``): the cost is
  the **sum** over the n−1 forward hops of RTT + hidden bytes ÷ bandwidth, plus the closing hop
  (last rank → rank 0) at RTT + 4 bytes ÷ bandwidth;
- tensor: every layer all-reduces its attention and its MLP output (2 per layer), a ring
  all-reduce of ``hidden bytes`` is 2(n−1) steps in which every hop carries ``hidden ÷ n``
  bytes at once, so a step lasts as long as the **slowest** hop: the cost is
  ``n_layers × 2 × 2(n−1) × max over hops (RTT + hidden ÷ n bytes ÷ bandwidth)``.

Both are monotone in every hop: a faster hop never raises a ring's cost, so choosing the ring
of least cost, a faster link or an added link never makes the chosen cost worse
(``tests/test_link_cost.py``). A single node costs 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from exo_p2p.types import ModelCard, Sharding

ASSUMED: Mapping[str, tuple[int, int]] = {
    "thunderbolt": (100, 2_500_000_000),
    "ethernet": (400, 117_000_000),
    "wifi": (4_000, 12_000_000),
    "loopback": (100, 1_000_000_000),
    "other": (1_000, 12_000_000),
}
"""Per interface type, (RTT µs, bytes/s) assumed while an address is not measured: Thunderbolt
~20 Gbit/s, Ethernet 1 Gbit/s, Wi-Fi ~100 Mbit/s with a few ms, "other" as slow as Wi-Fi
with 1 ms (never better than a measured LAN link)."""

TOKEN_BYTES = 4
"""Bytes of the token the last pipeline rank shares (one int32)."""


@dataclass(frozen=True, slots=True)
class Path:
    """One address of a link: the ``ip`` dialled, its RTT in µs and bytes/s (measured, or
    ``ASSUMED`` when ``measured`` is False)."""

    ip: str
    rtt_us: int
    bytes_per_s: int
    measured: bool = False


@dataclass(frozen=True, slots=True)
class CostModel:
    """How a ring's hops add up per token: each forward hop carries ``hop_bytes``, the closing
    hop (last rank → rank 0) ``close_bytes``; the hops' costs are summed (``combine="sum"``) or
    the slowest taken (``"max"``), then multiplied by ``factor``."""

    hop_bytes: int
    close_bytes: int
    combine: Literal["sum", "max"]
    factor: int


def assumed_path(ip: str, interface_type: str) -> Path:
    """The path of an unmeasured address, with the ``ASSUMED`` figures of its interface type."""
    rtt, bw = ASSUMED.get(interface_type, ASSUMED["other"])
    return Path(ip, rtt, bw, measured=False)


def measured_path(ip: str, interface_type: str, rtt_us: int, bytes_per_s: int | None) -> Path:
    """A measured address; its bandwidth is ``ASSUMED`` while not measured yet."""
    bw = bytes_per_s if bytes_per_s and bytes_per_s > 0 else ASSUMED.get(interface_type, ASSUMED["other"])[1]
    return Path(ip, max(0, rtt_us), bw, measured=True)


def hop_cost_us(path: Path, nbytes: int) -> int:
    """Microseconds to move ``nbytes`` over ``path`` once: RTT + bytes ÷ bandwidth (rounded up)."""
    return path.rtt_us + -(-nbytes * 1_000_000 // max(1, path.bytes_per_s))


def best_path(paths: Sequence[Path], nbytes: int) -> Path:
    """The cheapest of ``paths`` for ``nbytes`` (ties: measured first, then the smallest ip).

    Raises ``ValueError`` when ``paths`` is empty."""
    if not paths:
        raise ValueError("a link without any address")
    return min(paths, key=lambda p: (hop_cost_us(p, nbytes), not p.measured, p.ip))


def hidden_bytes(card: ModelCard) -> int:
    """Bytes of one token's hidden state: ``hidden_size × activation bytes`` (4 when unknown)."""
    return card.hidden_size * (card.activation_dtype_bytes or 4)


def cost_model(card: ModelCard, sharding: Sharding, size: int) -> CostModel:
    """The ``CostModel`` of a ring of ``size`` ranks of ``card`` (module docstring)."""
    hidden = hidden_bytes(card)
    if sharding == "tensor":
        chunk = -(-hidden // max(1, size))
        return CostModel(chunk, chunk, "max", card.n_layers * 2 * 2 * max(0, size - 1))
    return CostModel(hidden, TOKEN_BYTES, "sum", 1)


def ring_cost_us(model: CostModel, forward: Sequence[int], closing: int | None) -> int:
    """A ring's cost per token from its forward hops' and closing hop's costs (µs, each from
    ``hop_cost_us`` with ``model.hop_bytes`` / ``model.close_bytes``); 0 for a single node
    (no hops, ``closing`` None)."""
    hops = [*forward, *(() if closing is None else (closing,))]
    if not hops:
        return 0
    combined = sum(hops) if model.combine == "sum" else max(hops)
    return model.factor * combined


def lower_bound_us(model: CostModel, partial: int, hops_left: int, cheapest: int) -> int:
    """A lower bound of the ring cost (``factor`` applied) of any completion of a path whose hops
    so far combine to ``partial`` (µs, before ``factor``), with ``hops_left`` hops still to add,
    none cheaper than ``cheapest`` µs (``master.placement.branch_and_bound``)."""
    if model.combine == "sum":
        return model.factor * (partial + hops_left * cheapest)
    return model.factor * (max(partial, cheapest) if hops_left else partial)
