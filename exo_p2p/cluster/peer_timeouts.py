"""When the master times a node out (pure; docs/architecture.md#rules "Timeouts").

The master records ``NodeTimedOut`` for a node of State it has not heard from for
``timeout`` seconds — counted from the node's last heartbeat, or from the moment this node
became master when that is later (or the node was never heard). A new master thus gives
every node a full timeout from the moment it becomes master: it never times out a node only
because its own clock started earlier (at node start) or because it heard that node's last
heartbeat, long ago, while still a follower whose view was not yet complete.

One node is exempt from that grace: the master this node followed and lost just before it
became master (``lost_master``). This node heard that master's heartbeats itself, as its
follower, until they stopped, so the ordinary rule — ``timeout`` seconds after its last
heartbeat — is exact for it. A killed master's instances are then failed (and re-placed)
``timeout`` seconds after its death, not the failover time plus ``timeout`` (under
scripts/chaos.py the slow recoveries were master kills).

A node the master has no connection to is gone sooner, after ``disconnected_timeout``
(``DISCONNECTED_TIMEOUT``) s without a connection and without a sign of life (once a new
master's grace is over; for the lost master at once): a killed
node's connection closes within ~0.2 s, and waiting the full timeout only kept a dead node
listed, so a failed instance was re-placed onto it (under scripts/chaos.py every node kill spent ~3 s
that way). A live node whose connection to the master dropped is still heard through
gossip relayed by other peers, and redials within a second.

A node's own local events count as heard from it, like a heartbeat (``last_sign_of_life``):
a restarted node's profile can reach the master over a direct stream before its first
heartbeat does, and the master, holding only the dead incarnation's last heartbeat from more
than ``timeout`` s before, timed the node out again right after it rejoined (under scripts/chaos.py a
killed node was back in State for 0.4 s, out again, back 1.5 s later).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from exo_p2p import defaults
from exo_p2p.cluster.liveness import Stalled, gone_silent, no_stall


def timed_out(
    nodes: Iterable[str],
    *,
    self_id: str,
    last_heard: Callable[[str], float | None],
    master_since: float,
    now: float,
    timeout: float,
    lost_master: str | None = None,
    disconnected_since: Callable[[str], float | None] = lambda _node: None,
    disconnected_timeout: float = defaults.DISCONNECTED_TIMEOUT,
    stalled: Stalled = no_stall,
    peer_lag: Callable[[str], float] = lambda _node: 0.0,
) -> list[str]:
    """The nodes of ``nodes`` (not ``self_id``) with ``now - max(last heard, master_since)
    >= timeout``, in the order given. Times are the master's monotonic seconds;
    ``last_heard(node)`` is None for a node never heard. ``lost_master``: the master this
    node followed before it became master; when it was heard, its time counts from its
    last heartbeat alone (module docstring). ``disconnected_since(node)``: since when the
    master has had no connection to the node (None: connected); such a node is gone after
    ``disconnected_timeout`` s of silence already (module docstring). ``stalled``: this
    node's own loop stalls, which do not count as a node's silence (``liveness.gone_silent``);
    ``peer_lag(node)``: the loop lag the node's last heartbeat reported (seconds), which does
    not either (together with ``stalled``, at most ``timeout`` of grace)."""
    out = []
    for node in nodes:
        if node == self_id:
            continue
        heard = last_heard(node)
        if node == lost_master and heard is not None:
            since = heard
        else:
            since = master_since if heard is None else max(heard, master_since)
        cut = disconnected_since(node) if node == lost_master or now - master_since >= timeout else None
        if gone_silent(since, now, timeout, stalled, peer_lag(node)) or (cut is not None and now - max(since, cut) >= disconnected_timeout):
            out.append(node)
    return out


def last_sign_of_life(heartbeat_at: float | None, events_at: float | None) -> float | None:
    """When a node was last heard: its last heartbeat or its last local events received by
    the master, whichever is later (None: neither)."""
    times = [t for t in (heartbeat_at, events_at) if t is not None]
    return max(times) if times else None
