"""What the node hands the cluster member: timings (``ClusterSettings``, defaults from
``exo_p2p.defaults``) and the master role (``MasterHooks``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from exo_p2p import defaults
from exo_p2p.cluster.liveness import Stalled, no_stall
from exo_p2p.types import Command, CommandResult, Event, LocalEvent


@dataclass
class ClusterSettings:
    """Timings in seconds and sizes in events; each default is explained in ``exo_p2p.defaults``."""

    heartbeat_interval: float = defaults.HEARTBEAT_INTERVAL
    peer_timeout: float = defaults.PEER_TIMEOUT
    settle: float = defaults.START_SETTLE
    known_settle: float = defaults.KNOWN_SETTLE
    failover_settle: float = defaults.FAILOVER_SETTLE
    disconnect_grace: float = defaults.DISCONNECT_GRACE
    resend_interval: float = defaults.RESEND_INTERVAL
    command_timeout: float = defaults.COMMAND_TIMEOUT
    request_timeout: float = defaults.REQUEST_TIMEOUT
    max_local_batch: int = defaults.MAX_LOCAL_BATCH
    max_global_batch: int = defaults.MAX_GLOBAL_BATCH
    max_outbox: int = defaults.MAX_OUTBOX
    stalled: Stalled = no_stall
    """This node's own loop stalls (``exo_p2p.node.loop_watch.LoopWatch.stalls.between``): not
    counted as a peer's silence (``cluster.liveness``)."""
    longest_stall: Callable[[float], float] = lambda _since: 0.0
    """The longest own loop stall (seconds) that ended since a monotonic time
    (``exo_p2p.node.loop_watch.LoopWatch.stalls.longest_since``): reported in this node's
    heartbeat (``Heartbeat.lag_ms``)."""
    fault_hooks: dict[str, str] = field(default_factory=dict)
    """Tests only (``--fault-hook``): ``gossip_drop``/``gossip_dup``/``gossip_reorder`` mistreat
    the messages this node receives on the local- and global-events topics (``cluster.faults``)."""


@dataclass
class MasterHooks:
    """The master role as the cluster drives it (implemented by the node with ``master``)."""

    start: Callable[[int], Awaitable[None]]
    """Become master with this term (sequence ``MasterElected`` first)."""
    stop: Callable[[], Awaitable[None]]
    """Stop sequencing (another master won)."""
    accept_local: Callable[[LocalEvent], Awaitable[None]]
    command: Callable[[Command], Awaitable[CommandResult]]
    emit: Callable[[list[Event]], Awaitable[int]]

