"""Who is master: deterministic rules over the heartbeats a node has heard (pure).

Rules (design.md §4.8, §5a; issue 3 "Election"):

1. **Follow a sitting master.** Among the nodes heard from within the liveness timeout
   (this node included) that claim to be master, follow the one with the highest
   ``(term, priority, node_id)``. There is no preemption: a node with a higher priority, or
   a restarted former master, never unseats a live master. When two masters meet (a healed
   partition, or a lone node joining), the lower one steps down and follows the higher one;
   its divergent events are dropped (the follower's log sync replaces them).
2. **Elect when there is none.** When no live node claims mastership, and this node has
   been in that situation for ``settle`` seconds (so heartbeats of an existing master have
   had time to arrive), the live node with the highest ``(priority, last_idx, node_id)``
   becomes master, with term ``max(terms heard) + 1``. Every node computes the same winner
   from the same heartbeats; only the winner acts (it claims in its heartbeat), the others
   wait for its claim. A winner that lacks events others have fetches them before claiming
   (the cluster role does that).
3. Nodes with another ``boot_id`` for this node's own id are duplicates, not peers (the
   cluster role refuses to join then).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from exo_p2p.cluster.messages import Heartbeat


@dataclass(frozen=True)
class ElectionView:
    """What this node knows right now: its own heartbeat, the live peers' latest heartbeats,
    and for how many seconds no live master has been seen (0 when one is)."""

    own: Heartbeat
    peers: tuple[Heartbeat, ...]
    masterless_for: float


@dataclass(frozen=True)
class Decision:
    """``follow``: the node to follow (possibly this node) with its ``term``; ``claim``: this
    node should become master now with ``term``; neither: wait."""

    follow: str | None = None
    term: int = 0
    claim: bool = False


def master_rank(hb: Heartbeat) -> tuple[int, int, str]:
    """Order among masters that meet: higher ``(term, priority, node_id)`` wins."""
    return (hb.term, hb.priority, hb.node_id)


def candidate_rank(hb: Heartbeat) -> tuple[int, int, str]:
    """Order among candidates when there is no master: ``(priority, last_idx, node_id)``."""
    return (hb.priority, hb.last_idx, hb.node_id)


def decide(view: ElectionView, *, settle: float) -> Decision:
    """Apply the rules above to ``view``; see the module docstring."""
    everyone = (view.own, *view.peers)
    masters = [hb for hb in everyone if hb.master == hb.node_id]
    if masters:
        best = max(masters, key=master_rank)
        return Decision(follow=best.node_id, term=best.term)
    if view.masterless_for < settle:
        return Decision()
    winner = max(everyone, key=candidate_rank)
    if winner.node_id != view.own.node_id:
        return Decision()
    return Decision(follow=view.own.node_id, term=max_term(everyone) + 1, claim=True)


def max_term(heartbeats: Iterable[Heartbeat]) -> int:
    return max((hb.term for hb in heartbeats), default=0)
