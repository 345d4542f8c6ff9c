"""Who is master: deterministic rules over the heartbeats a node has heard (pure).

Rules (docs/architecture.md#rules "Election"):

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
   higher term, never makes the majority drop its committed events (the heal rule, ``master_rank``).
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
4. **A master yields to a rival that refuses it.** ``cluster.claims`` admits a claim whose
   log diverged from this node's only at a plausible term (at most one above its own), so
   of two masters that meet with diverged logs and terms two or more apart, the one with the
   lower term refuses the other's claim and keeps its seat, while the higher one admits the
   lower one's claim and, ranked higher by rule 1, keeps its seat too: a split that never
   heals. So a master that has heard, for ``yield_after`` seconds without a break, an
   admitted rival claim it outranks (the rival did not step down, so it refuses this
   master's claim, or cannot check it), yields: it follows the best such rival whose side
   is at least its own (a bigger side is never given up: its claim is admitted by every
   node that hears its followers, ``cluster.claims`` rule 2). Both masters never refuse each
   other (if ``x > y + 1`` then ``y <= x + 1``), so of two mutually reachable masters one
   steps down within ``yield_after`` plus a probe. A forged claim is still never yielded to:
   only admitted claims count, and the refusal of an implausible term stands.

``election_step`` is one pass of the election loop (``role.RoleKeeper``) over these rules:
the followed master is lost when no reachable, admitted peer still claims it (a master that
stepped down beats on without claiming; following it would wait forever); the masterless
time counts from the moment no claim is heard; then ``decide``. ``settle_for`` picks the
settle time: the start settle during twice its length after start (until this node first
follows a master), else the failover one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import msgspec

from exo_p2p import defaults
from exo_p2p.cluster.messages import Heartbeat


@dataclass(frozen=True)
class ElectionView:
    """What this node knows right now: its own heartbeat, the live peers' latest heartbeats,
    and for how many seconds no live master has been seen (0 when one is)."""

    own: Heartbeat
    peers: tuple[Heartbeat, ...]
    masterless_for: float


@dataclass(frozen=True)
class ElectionDecision:
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


def decide(view: ElectionView, *, settle: float) -> ElectionDecision:
    """Apply the rules above to ``view``; see the module docstring."""
    everyone = (view.own, *view.peers)
    masters = [hb for hb in everyone if hb.master == hb.node_id]
    if masters:
        best = max(masters, key=lambda m: master_rank(m, support(everyone, m.node_id)))
        return ElectionDecision(follow=best.node_id, term=best.term)
    if view.masterless_for < settle:
        return ElectionDecision()
    winner = max(everyone, key=candidate_rank)
    if winner.node_id != view.own.node_id:
        return ElectionDecision()
    return ElectionDecision(follow=view.own.node_id, term=max_term(everyone) + 1, claim=True)


def max_term(heartbeats: Iterable[Heartbeat]) -> int:
    return max((hb.term for hb in heartbeats), default=0)


@dataclass(frozen=True)
class Seat:
    """What this node believes: the master it follows (None: none), the term, and since when
    (its monotonic clock, seconds) it has had no master and heard no claim."""

    master: str | None
    term: int
    masterless_since: float | None
    rival_since: float | None = None
    """Since when this master has heard, without a break, an admitted rival claim (rule 4)."""


@dataclass(frozen=True)
class ElectionStep:
    """The outcome of one pass: the new ``seat``; ``lost``: the followed master is gone;
    ``claim``: become master with this term; ``follow``: follow this other node at ``term``
    (``yielded``: this master gives its seat to a rival that refuses it, rule 4)."""

    seat: Seat
    lost: bool = False
    claim: int | None = None
    follow: str | None = None
    term: int = 0
    yielded: bool = False


def election_step(seat: Seat, own: Heartbeat, peers: Sequence[Heartbeat], pending: Sequence[Heartbeat],
                  now: float, *, settle: float, yield_after: float = defaults.RIVAL_YIELD_AFTER) -> ElectionStep:
    """One pass of the election loop at ``now`` (module docstring). ``own``: this node's
    heartbeat; ``peers``: the reachable peers whose claims (if any) are admitted;
    ``pending``: claims still being checked (they hold off an election); ``yield_after``:
    seconds of rule 4. Reads no clock."""
    me = own.node_id
    lost = seat.master not in (None, me) and not any(p.node_id == seat.master and p.master == p.node_id for p in peers)
    if lost:
        seat = Seat(None, seat.term, now)
    claims = [p for p in peers if p.master == p.node_id] + list(pending)
    if seat.master is None and not claims and seat.masterless_since is None:
        seat = replace(seat, masterless_since=now)
    since = now if seat.masterless_since is None else seat.masterless_since
    masterless_for = 0.0 if (claims or seat.master is not None) else now - since
    own = msgspec.structs.replace(own, master=seat.master, term=seat.term)
    decision = decide(ElectionView(own, tuple(peers), masterless_for), settle=settle)
    if decision.claim:
        return ElectionStep(seat, lost, claim=decision.term, term=decision.term)
    changed = decision.follow != seat.master or decision.term != seat.term
    if decision.follow is not None and decision.follow != me and changed:
        return ElectionStep(replace(seat, rival_since=None), lost, follow=decision.follow, term=decision.term)
    if seat.master != me or decision.follow != me:
        return ElectionStep(replace(seat, rival_since=None), lost)
    return _rivals(seat, own, peers, now, yield_after)


def _rivals(seat: Seat, own: Heartbeat, peers: Sequence[Heartbeat], now: float, yield_after: float) -> ElectionStep:
    """Rule 4 for a master that keeps its seat this pass."""
    rivals = [p for p in peers if p.master == p.node_id]
    if not rivals:
        return ElectionStep(replace(seat, rival_since=None))
    since = now if seat.rival_since is None else seat.rival_since
    if now - since < yield_after:
        return ElectionStep(replace(seat, rival_since=since))
    everyone = (own, *peers)
    mine = support(everyone, own.node_id)
    sides = {p.node_id: support(everyone, p.node_id) for p in rivals}
    eligible = [p for p in rivals if sides[p.node_id] >= mine]
    if not eligible:
        return ElectionStep(replace(seat, rival_since=since))
    best = max(eligible, key=lambda p: master_rank(p, sides[p.node_id]))
    return ElectionStep(replace(seat, rival_since=None), follow=best.node_id, term=best.term, yielded=True)


def settle_for(now: float, started_at: float, start_settle: float, failover_settle: float, *,
               followed: bool = False) -> float:
    """Seconds of masterless time before an election at ``now`` (module docstring). A node
    that has followed a master since it started (``followed``) is past its start: losing
    that master is a failover (a node restarted a moment before the master died waited the
    whole start settle, 5 s, as the election's winner under scripts/chaos.py)."""
    if followed:
        return failover_settle
    return start_settle if now - started_at < 2 * start_settle else failover_settle
