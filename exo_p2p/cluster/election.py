"""Who is master: deterministic rules over the heartbeats a node has heard (pure).

Rules (design.md §4.8, §5a; issue 3 "Election"):

1. **Follow a sitting master.** Among the nodes heard from within the liveness timeout
   (this node included) that claim to be master, follow the one ranked highest by
   ``master_rank``: the side that kept the cluster going wins — more live nodes following it
   (``support``: the heartbeats in the view that name it as master, its own included), then
   more committed events (``Heartbeat.commit_idx``, at most its ``last_idx``), then the
   higher ``(term, priority, node_id)``. There is no preemption: a node with a higher
   priority, or a restarted former master, never unseats a live master. When two masters
   meet (a healed partition, or a lone node joining), the lower one steps down and follows
   the higher one; its divergent events are dropped (the follower's log sync replaces them).
   So a single node that was cut off (a laptop that slept) and claimed mastership alone, at a
   higher term, never makes the majority drop its committed events (issue 9, item 5).
   Support is counted from the heartbeats this node holds, not from the claimer's own word,
   so a late (stale) claim of a former master counts only itself.
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


def support(heartbeats: Iterable[Heartbeat], master: str) -> int:
    """How many of ``heartbeats`` (one per node) name ``master`` as the master they follow
    (the master's own claim included): the live nodes of its side, as this node sees them."""
    return sum(1 for hb in heartbeats if hb.master == master)


def master_rank(hb: Heartbeat, side: int = 1) -> tuple[int, int, int, int, str]:
    """Order among masters that meet: higher ``(side, committed, term, priority, node_id)``
    wins, where ``side`` is the claim's ``support`` and ``committed`` is
    ``min(hb.commit_idx, hb.last_idx)`` (a claimer cannot count events it does not hold)."""
    return (side, min(hb.commit_idx, hb.last_idx), hb.term, hb.priority, hb.node_id)


def candidate_rank(hb: Heartbeat) -> tuple[int, int, str]:
    """Order among candidates when there is no master: ``(priority, last_idx, node_id)``."""
    return (hb.priority, hb.last_idx, hb.node_id)


def decide(view: ElectionView, *, settle: float) -> Decision:
    """Apply the rules above to ``view``; see the module docstring."""
    everyone = (view.own, *view.peers)
    masters = [hb for hb in everyone if hb.master == hb.node_id]
    if masters:
        best = max(masters, key=lambda m: master_rank(m, support(everyone, m.node_id)))
        return Decision(follow=best.node_id, term=best.term)
    if view.masterless_for < settle:
        return Decision()
    winner = max(everyone, key=candidate_rank)
    if winner.node_id != view.own.node_id:
        return Decision()
    return Decision(follow=view.own.node_id, term=max_term(everyone) + 1, claim=True)


def max_term(heartbeats: Iterable[Heartbeat]) -> int:
    return max((hb.term for hb in heartbeats), default=0)
