"""Automatic re-placement of failed instances (docs/architecture.md#instance-lifecycle).

A failed instance is re-placed (new instance id, ``replaces`` = the failed one, ``attempt``
+ 1) at once when it had served, else after a backoff of ``BACKOFF_BASE * 2**attempt``
seconds (``replace_delay``), when the model fits
somewhere; after ``MAX_ATTEMPTS`` re-placements in a row that never served (a crash loop) it
is given up and its failure reason says why. An instance that served (every rank Ready
once) starts the count again when it fails, so a long-lived instance survives any number of
node restarts spread over its life. A re-placement that fits nowhere is tried again for
``RELEASE_WAIT`` seconds after the failure before the instance is given up: the failed
instance's runners still hold their memory until they exit, and their nodes re-publish it
within a profile tick after (a report taken while they ran is the smaller of the two figures
placement takes, ``master.placement.memory.usable_memory``). Deleting an instance is final (a deleted instance is not in State, so never re-placed).
The timing uses the master's monotonic clock only; the decisions are pure.

A re-placement waits until every node of the failed instance is either heard again since the
failure or no longer reachable (``unconfirmed``; at most ``CONFIRM_WAIT``). The ranks of an
instance fail together: when one rank's node is killed, the rank on a surviving node loses
its ring ("[ring] connection to a peer was lost") and its runner can exit at its next
agreement round, a fraction of a second later. The master then learns of a failed runner
while the killed node still counts as reachable (its connection closed less than
``DISCONNECT_GRACE`` ago), and a successor placed at once could be put on the dead node; its
failure ``DISCONNECTED_TIMEOUT`` later then needed a second re-placement, and the requests
waiting for the first one waited for that too. A live node is heard again within a heartbeat
(``HEARTBEAT_INTERVAL``), so the wait costs a healthy cluster at most that.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from exo_p2p import defaults
from master.placement.topology import ring_ip
from exo_p2p.types import Event, Instance, InstanceCreated, InstanceDeleted, InstanceFailed, PlacedNode, RankSettings, State
from master.placement.keep_layers import keep_layers
from master.placement.memory import usable_memory
from master.placement.place import PlacementError, place_instance

MAX_ATTEMPTS = 3
BACKOFF_BASE = 1.0
"""Seconds before the first re-placement; doubles with every attempt."""
RELEASE_WAIT = 10.0
"""Seconds after a failure during which a re-placement that fits nowhere is retried rather
than given up: the failed runners exit within ``T_FAIL`` (10 s) and their nodes re-publish the
memory they held within 2 s of that."""


CONFIRM_WAIT = defaults.PEER_TIMEOUT
"""Seconds a re-placement waits at most for the failed instance's nodes to be heard again or
become unreachable: by then a node not heard is not live (``PEER_TIMEOUT``), i.e. unreachable."""


def unconfirmed(failed: Instance, reachable: frozenset[str], heard_ago: Callable[[str], float | None],
                waited: float) -> frozenset[str]:
    """Nodes of ``failed``'s shards that are still in ``reachable`` but were not heard since the
    failure (see the module doc): ``heard_ago(node)`` is seconds since the master last heard
    the node (0: now, or the master itself; None: never), ``waited`` seconds since the master
    saw the instance failed. A node heard ``waited`` seconds ago or earlier is one the failure
    may be about; the re-placement should not choose it yet."""
    out = set()
    for node in {shard.node_id for shard in failed.shards} & reachable:
        ago = heard_ago(node)
        if ago is None or (ago > 0 and ago >= waited):
            out.add(node)
    return frozenset(out)


def backoff(attempt: int) -> float:
    """Seconds to wait before re-placing an instance that failed on attempt ``attempt``."""
    return BACKOFF_BASE * (2**attempt)


def replace_delay(failed: Instance) -> float:
    """Seconds between ``failed``'s failure and its re-placement: none when it had served
    (every rank Ready once: a node or runner died under a working instance, there is no crash
    loop to slow down, and every second waited is a second the model is not served), else
    ``backoff(failed.attempt)``."""
    return 0.0 if failed.served else backoff(failed.attempt)


def _without(state: State, nodes: frozenset[str]) -> State:
    """``state`` as placement should see it without ``nodes`` (and their edges)."""
    return msgspec.structs.replace(
        state,
        nodes={k: v for k, v in state.nodes.items() if k not in nodes},
        edges={a: {b: e for b, e in out.items() if b not in nodes} for a, out in state.edges.items() if a not in nodes},
    )


def without_lost_links(state: State, failed: Instance) -> State:
    """``state`` without the figures of the addresses ``failed``'s ring used in the reverse
    direction of a hop whose address is lost (retracted from ``State.links`` while the pair
    keeps others, docs/links.md#when-a-link-changes), where the reverse direction keeps
    other addresses. A cable that went down is noticed by the two nodes' probers apart,
    seconds apart: placed before the second notices, a ring would take the other end of the
    same dead link and fail ~30 s later ("[ring] Couldn't connect"). Unchanged when no hop
    of the ring was lost."""
    shards = failed.shards
    drop: dict[tuple[str, str], set[str]] = {}
    for rank, shard in enumerate(shards if len(shards) > 1 else ()):
        a, b = shards[rank - 1].node_id, shard.node_id
        measured = state.links.get(a, {}).get(b, {})
        if not measured or ring_ip(shard.ring_address) in {ring_ip(x) for x in measured}:
            continue  # unmeasured pair, or the address is still there
        for r, s in enumerate(shards):  # the hops b -> a of the ring: their addresses are suspect
            if shards[r - 1].node_id == b and s.node_id == a:
                drop.setdefault((b, a), set()).add(ring_ip(s.ring_address) or "")
    links = {src: dict(sinks) for src, sinks in state.links.items()}
    for (src, sink), ips in drop.items():
        kept = {x: f for x, f in links.get(src, {}).get(sink, {}).items() if ring_ip(x) not in ips}
        if kept:
            links[src][sink] = kept
    return msgspec.structs.replace(state, links=links) if drop else state


def effective_attempt(failed: Instance) -> int:
    """Re-placements so far in the current crash loop: ``failed.attempt``, or 0 when the
    failed instance had served (every rank Ready once) — the count starts again then."""
    return 0 if failed.served else failed.attempt


def replacement(
    state: State,
    failed: Instance,
    new_instance_id: str,
    *,
    unreachable: frozenset[str] = frozenset(),
    rank_settings: RankSettings | None = None,
    waited: float = RELEASE_WAIT,
) -> tuple[Event, ...]:
    """Events that re-place ``failed``: delete it and create its successor, or — when the
    attempts are used up or nothing fits — record that it was given up (the instance stays
    listed as failed with the reason; no runner is started).

    The successor keeps the failed instance's size when it still fits (``world_size`` nodes
    at least, same sharding; a shrunk instance's placed size first), else any size; on
    fewer ranks than that it is shrunk and records the placement (``placed_as``). Placed on
    the same nodes in the same ring order, each node keeps its layers (``keep_layers``: its
    prompt cache's disk blocks are of those layers). ``unreachable``: nodes the master does not hear
    right now (dead but not yet timed out): never chosen, so a re-placement does not land on
    the node whose death caused it; nor the other end of a ring link that was lost
    (``without_lost_links``). The successor keeps the failed instance's
    ``settings`` (decided once, when it was first placed), else takes ``rank_settings``.
    ``waited``: seconds since ``failed`` failed; below ``RELEASE_WAIT`` a placement that fits
    nowhere returns no events (the caller tries again) instead of giving the instance up."""
    reason = failed.failed_reason or "failed"
    if failed.gave_up:
        return ()
    if effective_attempt(failed) >= MAX_ATTEMPTS:
        return (InstanceFailed(failed.instance_id, f"{reason}; not re-placed: gave up after {MAX_ATTEMPTS} re-placements", final=True),)
    card = state.model_cards.get(failed.model_id)
    if card is None:
        return (InstanceFailed(failed.instance_id, f"{reason}; not re-placed: model {failed.model_id!r} is no longer in the cluster", final=True),)
    view = without_lost_links(_without(state, unreachable) if unreachable else state, failed)
    new = None
    error: PlacementError | None = None
    sizes = dict.fromkeys((failed.placed_ranks, failed.world_size, 1))  # the placed size first, for a shrunk one
    for min_nodes, sharding in (*((n, failed.sharding) for n in sizes), (1, "pipeline")):
        try:
            new = place_instance(view, card, min_nodes=min_nodes, sharding=sharding, instance_id=new_instance_id)  # type: ignore[arg-type]
            break
        except PlacementError as exc:
            if min_nodes == 1 and error is None:
                error = exc  # the reason given: the same sharding at any size
    if new is None:
        if waited < RELEASE_WAIT:
            return ()  # the failed runners may still hold the memory it needs: try again
        return (InstanceFailed(failed.instance_id, f"{reason}; not re-placed: {error}", final=True),)
    new = keep_layers(failed, new, {s.node_id: usable_memory(view, s.node_id) for s in new.shards})
    new = msgspec.structs.replace(
        new, replaces=failed.instance_id, attempt=effective_attempt(failed) + 1, settings=failed.settings or rank_settings,
        placed=placed_as(state, failed, new.world_size),
    )
    return (InstanceDeleted(failed.instance_id), InstanceCreated(new))


def placed_as(state: State, failed: Instance, world_size: int) -> tuple[PlacedNode, ...]:
    """``Instance.placed`` of ``failed``'s successor of ``world_size`` ranks: the placement
    ``failed`` stood in for (its own ``placed``, else its shards' nodes, named as ``state``
    names them) when the successor has fewer ranks than that, else ``()``."""
    placed = failed.placed or tuple(
        PlacedNode(s.node_id, p.friendly_name if (p := state.nodes.get(s.node_id)) is not None else "",
                   s.start_layer, s.end_layer, s.share_bytes, s.weights_dtype)
        for s in sorted(failed.shards, key=lambda s: s.rank)
    )
    return placed if world_size < len(placed) else ()
