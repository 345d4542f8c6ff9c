"""Moving an idle instance onto a better ring when its links change (docs/links.md#when-a-link-changes).

Placement chooses a ring by the estimated network cost per token (``master.placement.cost``) with
the link figures of the moment. Links change after that: a cable is plugged back in, a
Thunderbolt bridge comes up, Wi-Fi degrades. This rule says when the master moves an instance
to the ring placement would choose now, reusing the switch of ``master.restore`` (a successor
placed beside the running instance with ``replaces`` = it and ``restores=True``; new requests
go to the successor once it is ready, the old one is deleted once it has no task in flight; a
successor that fails is deleted and the old one keeps serving).

An instance is **moved** when all of these hold (``better_ring``):

- it is ready, not failed, not shrunk (a shrunk one is ``master.restore``'s), has no task in
  flight, and every node of it is in State and reachable;
- its **current cost** — the cost function of placement over the addresses its ring actually
  uses (``Shard.ring_address``), with today's figures (``current_cost_us``) — is known: an
  address of the ring that has no figures while its link has others measured is new or lost,
  and a lost ring fails by itself (``master.replace``);
- the **best placement** now (``place_instance`` with the instance's size and sharding, the
  memory the instance holds still counted) has the same size and costs less by both a factor
  and a margin: ``current > RELINK_FACTOR × best`` and ``current − best > RELINK_MARGIN_US``
  (``worth_moving``), so noise in the figures (already quantised and confirmed over two rounds,
  ``exo_p2p.links.figures``) never moves it;
- that has held at every check for ``RELINK_SETTLE`` seconds (``better_since``: the first check
  that found it), so a figure that spiked under load and comes back does not move it;
- no restore or move is under way in the cluster (one at a time, ``restore_step`` first);
- no move of it (or of the instance it moved from) started in the last ``RELINK_INTERVAL`` s.

Hysteresis: after a move the instance runs on the best ring; moving back needs the other ring
to become ``RELINK_FACTOR`` times cheaper again, and at most one move per ``RELINK_INTERVAL``.
The successor records why it was placed (``Instance.moved``, shown by ``exo-p2p instances``);
the master logs it.

Pure: the master role (``master.role``) keeps ``not_before`` and ``better_since`` (its monotonic
clock; a new master starts with none, so it waits ``RELINK_SETTLE`` before its first move).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import msgspec

from master.placement.cost import CostModel, cost_model, hop_cost_us, ring_cost_us
from master.placement.topology import Topology, ring_ip, topology_from_state
from exo_p2p.state.views import instance_view
from exo_p2p.types import Event, Instance, InstanceCreated, State
from master.placement.place import PlacementError, place_instance
from master.restore import in_flight

RELINK_FACTOR = 2.0
"""A move needs the current ring to cost more than this many times the best one."""
RELINK_MARGIN_US = 2_000
"""...and more than this many µs per token above it (2 ms: about Wi-Fi vs Ethernet, ``ASSUMED``)."""
RELINK_SETTLE = 60.0
"""Seconds the gain must hold at every check before a move starts: four RTT rounds. A figure
that spiked under load (published after two rounds agree, ``exo_p2p.links.figures``) is put
back by the next two rounds that see it normal, within ~33 s; it never lasts this long."""
RELINK_INTERVAL = 300.0
"""Seconds after a move of an instance started before it (or its successor) may move again."""
RELINK_CHECK_EVERY = 5.0
"""Seconds between two checks of the rule (each costs one placement per idle instance)."""


class Move(msgspec.Struct, frozen=True):
    """A justified move: ``instance_id`` onto ``successor`` (not yet placed in State), with the
    ring's estimated network cost per token now (``current_us``) and the successor's (``best_us``)."""

    instance_id: str
    current_us: int
    best_us: int
    successor: Instance

    @property
    def why(self) -> str:
        """The reason recorded in ``Instance.moved`` and the master's log."""
        return (f"moved from {self.instance_id} to a faster ring: estimated network cost "
                f"{self.current_us} -> {self.best_us} us/token")


class RelinkPlan(msgspec.Struct, frozen=True):
    """What ``relink_step`` decided: ``events`` to sequence (the successor of ``move``),
    ``justified``: the instances a move is justified for at this check (the caller keeps
    since when: ``better_since``)."""

    events: tuple[Event, ...] = ()
    move: Move | None = None
    justified: frozenset[str] = frozenset()


def worth_moving(current_us: int, best_us: int) -> bool:
    """Whether a ring costing ``best_us`` is enough cheaper than one costing ``current_us``
    (µs per token) to move an instance: by ``RELINK_FACTOR`` and by ``RELINK_MARGIN_US``."""
    return current_us > RELINK_FACTOR * best_us and current_us - best_us > RELINK_MARGIN_US


def current_cost_us(topology: Topology, instance: Instance, model: CostModel) -> int | None:
    """The network cost per token (µs) of ``instance``'s ring over the addresses it uses, with
    ``topology``'s figures: rank r's ``ring_address`` is where rank r−1 reaches it (rank 0's:
    the closing hop). None when a hop's link or address is not in ``topology`` (see module doc);
    0 for one rank."""
    shards = instance.shards
    if len(shards) < 2:
        return 0
    costs = []
    for rank, shard in enumerate(shards):
        link = topology.link(shards[rank - 1].node_id, shard.node_id)
        ip = ring_ip(shard.ring_address)
        path = next((p for p in link.paths if p.ip == ip), None) if link is not None else None
        if path is None:
            return None
        costs.append(hop_cost_us(path, model.close_bytes if rank == 0 else model.hop_bytes))
    return ring_cost_us(model, costs[1:], costs[0])


def movable(state: State, instance: Instance, reachable: Collection[str]) -> bool:
    """Whether ``instance`` may be moved now: ready, not failed, not shrunk, not a successor
    under way, no task in flight, every node in State and in ``reachable``."""
    if instance.failed_reason is not None or instance.shrunk or len(instance.shards) < 2:
        return False
    if instance.restores and instance.replaces in state.instances:
        return False
    if any(s.node_id not in state.nodes or s.node_id not in reachable for s in instance.shards):
        return False
    return in_flight(state, instance.instance_id) == 0 and instance_view(state, instance).status == "ready"


def _among(state: State, reachable: Collection[str] | None) -> State:
    """``state`` as placement should see it: only the nodes in ``reachable`` (None: all)."""
    if reachable is None or set(state.nodes) <= set(reachable):
        return state
    keep = set(reachable)
    return msgspec.structs.replace(
        state, nodes={k: v for k, v in state.nodes.items() if k in keep},
        edges={a: {b: e for b, e in out.items() if b in keep} for a, out in state.edges.items() if a in keep})


def better_ring(state: State, instance: Instance, *, new_instance_id: str,
                reachable: Collection[str] | None = None) -> Move | None:
    """The move of ``instance`` the rule justifies now (module doc, without the clocks), or None.

    The better placement is sought among ``reachable`` nodes only (None: every node in State).
    Pure; the caller checks ``movable`` first. Never raises ``PlacementError`` (no placement:
    no move)."""
    card = state.model_cards.get(instance.model_id)
    if card is None:
        return None
    size = instance.world_size
    current = current_cost_us(topology_from_state(state), instance, cost_model(card, instance.sharding, size))
    if current is None:
        return None
    try:
        new = place_instance(_among(state, reachable), card, min_nodes=size, sharding=instance.sharding,
                             instance_id=new_instance_id)
    except PlacementError:
        return None
    if new.world_size != size:
        return None
    best = current_cost_us(topology_from_state(state), new, cost_model(card, instance.sharding, size))
    if best is None or not worth_moving(current, best):
        return None
    move = Move(instance.instance_id, current, best, new)
    successor = msgspec.structs.replace(new, replaces=instance.instance_id, restores=True,
                                        settings=instance.settings, moved=move.why)
    return msgspec.structs.replace(move, successor=successor)


def relink_step(
    state: State,
    *,
    reachable: Collection[str],
    now: float,
    not_before: Mapping[str, float],
    better_since: Mapping[str, float],
    new_instance_id: str,
) -> RelinkPlan:
    """One check of the rule at ``now`` (seconds, the master's monotonic clock).

    ``not_before``: instance id → the earliest ``now`` it may move (absent: any time);
    ``better_since``: instance id → the ``now`` of the first check of an unbroken run that
    found its move justified. Call it only when no restore or move is under way
    (``master.restore.restore_step`` found none). Returns the justified instances and the
    start of at most one move (the first by id whose gain held ``RELINK_SETTLE`` s)."""
    justified: set[str] = set()
    start: Move | None = None
    for instance_id, inst in sorted(state.instances.items()):
        if now < not_before.get(instance_id, now) or not movable(state, inst, reachable):
            continue
        move = better_ring(state, inst, new_instance_id=new_instance_id, reachable=reachable)
        if move is None:
            continue
        justified.add(instance_id)
        if start is None and now - better_since.get(instance_id, now) >= RELINK_SETTLE:
            start = move
    if start is None:
        return RelinkPlan(justified=frozenset(justified))
    return RelinkPlan((InstanceCreated(start.successor),), start, frozenset(justified))


@dataclass
class RelinkClock:
    """The master's memory for ``relink_step`` (its monotonic clock, seconds): when it last
    checked, ``not_before`` and ``better_since`` (see ``relink_step``)."""

    not_before: dict[str, float] = field(default_factory=dict)
    better_since: dict[str, float] = field(default_factory=dict)
    last_check: float | None = None

    def due(self, now: float) -> bool:
        """Whether a check is due: none yet, or ``RELINK_CHECK_EVERY`` s since the last."""
        return self.last_check is None or now - self.last_check >= RELINK_CHECK_EVERY

    def checked(self, now: float, plan: RelinkPlan) -> None:
        """Record a check at ``now`` that gave ``plan``: an unbroken run of justified checks
        keeps its start, a break forgets it; a move bars its instance and the successor from
        moving for ``RELINK_INTERVAL`` s."""
        self.last_check = now
        self.better_since = {i: self.better_since.get(i, now) for i in plan.justified}
        if plan.move is not None:
            self.better_since.pop(plan.move.instance_id, None)
            for instance_id in (plan.move.instance_id, plan.move.successor.instance_id):
                self.not_before[instance_id] = now + RELINK_INTERVAL
        self.not_before = {i: t for i, t in self.not_before.items() if t > now}
