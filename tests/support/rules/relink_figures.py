"""Link figures and states for relinking."""

from __future__ import annotations

import msgspec

from exo_p2p.types import LinkFigures, State
from tests.support.rules.placement_cluster import GIB, card, cluster


MODEL = card(8, 8 * GIB)
FAST = {"n0": "10.1.0.1", "n1": "10.1.0.2"}
SLOW = {"n0": "10.2.0.1", "n1": "10.2.0.2"}


def _figures(fast: tuple[int, int] | None, slow: tuple[int, int] | None = (21_000, 2_400_000)) -> dict:
    """State.links of n0 <-> n1: per direction the sink's fast and slow address with (RTT µs,
    bytes/s), or without the address when None."""
    links: dict = {}
    for a, b in (("n0", "n1"), ("n1", "n0")):
        for ips, figs in ((FAST, fast), (SLOW, slow)):
            if figs is not None:
                links.setdefault(a, {}).setdefault(b, {})[ips[b]] = LinkFigures(ips[b], figs[0], figs[1], "ethernet")
    return links


def _state(links: dict) -> State:
    base = cluster([(64 * GIB, 64 * GIB), (64 * GIB, 64 * GIB)])
    return msgspec.structs.replace(base, model_cards={"m": MODEL}, links=links)
