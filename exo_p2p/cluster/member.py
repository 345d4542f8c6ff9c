"""This node's part in the cluster: the facade that wires the collaborators.

``ClusterMember`` runs over the libp2p ``Network`` and the node's ``Replica``. It knows
nothing of placement or runners: the node (composition root) injects the master role
through ``MasterHooks``. Each job is one collaborator with its rules as pure functions
(docs/architecture.md, "The cluster core"):

- ``heartbeats.PeerView``: heartbeats in and out, liveness, reachability;
- ``role.RoleKeeper``: the election (``election.election_step``), becoming and leaving master;
- ``outbox.LocalOutbox``: local events re-sent until seen indexed;
- ``sequencing.MasterLink``: the master's side of the log (publish, take local events, time out);
- ``log_sync.LogFollower``: apply, fetch and serve the replicated log;
- ``mesh.MeshKeeper``: dial every node, keep topology edges equal to connections;
- ``commands.CommandClient``: commands to the master, answered once committed;
- ``chunks.ChunkSender``: generated chunks to the API node.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import trio

from exo_p2p import defaults
from exo_p2p.cluster.chunks import ChunkSender
from exo_p2p.cluster.commands import CommandClient
from exo_p2p.cluster.common import Counters, Role
from exo_p2p.cluster.event_times import EventTimes
from exo_p2p.cluster.faults import with_gossip_faults
from exo_p2p.cluster.heartbeats import PeerView
from exo_p2p.cluster.log_sync import LogFollower, tail_diverged
from exo_p2p.cluster.mesh import MeshKeeper, ip_of
from exo_p2p.cluster.messages import (
    CHUNKS_PROTOCOL, COMMAND_PROTOCOL, GLOBAL_EVENTS_TOPIC, HEARTBEAT_PROTOCOL, HEARTBEATS_TOPIC, LOCAL_EVENTS_PROTOCOL,
    LOCAL_EVENTS_TOPIC, LOG_PROTOCOL, Heartbeat,
)
from exo_p2p.cluster.outbox import LocalOutbox
from exo_p2p.cluster.role import RoleKeeper
from exo_p2p.cluster.sequencing import MasterLink
from exo_p2p.cluster.settings import ClusterSettings, MasterHooks
from exo_p2p.replica import Replica
from exo_p2p.types import Chunk, Command, CommandResult, Event, IndexedEvent

__all__ = ["ClusterMember", "ClusterSettings", "MasterHooks", "tail_diverged", "ip_of"]


class ClusterMember:
    """This node in the cluster (module docstring). Public surface, used by ``exo_p2p.node``:
    ``send_local``, ``command``, ``send_chunk``, ``publish_indexed``, ``wait_committed``,
    ``reachable_nodes``, ``alone_for``, ``last_seen``, ``master``, ``term``, ``is_master``,
    ``counters``, ``event_times``, ``duplicate_identity``, ``local_events_pending``."""

    def __init__(self, net, replica: Replica, node_id: str, boot_id: str, hooks: MasterHooks, *,  # type: ignore[no-untyped-def]
                 priority: int = 0, settings: ClusterSettings | None = None,
                 on_chunks: Callable[[str, list[Chunk], list[int]], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.net, self.replica, self.node_id, self.boot_id, self.hooks = net, replica, node_id, boot_id, hooks
        self.settings = settings or ClusterSettings()
        self.counters = Counters()
        self.role = Role(node_id, term=replica.state.term)
        self.event_times = EventTimes(node_id, clock=time.monotonic)
        args = (self.settings, self.counters)
        self.peers = PeerView(net, replica, self.role, boot_id, priority, *args, clock)
        self.roles = RoleKeeper(net, replica, self.role, self.peers, hooks, *args, clock)
        self.outbox = LocalOutbox(net, self.role, boot_id, hooks, *args, clock)
        self.sequencer = MasterLink(net, replica, self.role, self.peers, hooks, *args, self.event_times,
                                    master_since=lambda: max(self.roles.master_since, self.peers.started_at), clock=clock,
                                    lost_master=lambda: self.roles.lost_master)
        self.log = LogFollower(net, replica, self.role, self.peers, *args, self.event_times)
        self.mesh = MeshKeeper(net, replica, self.role, self.peers, self.outbox, clock)
        self.commands = CommandClient(net, replica, self.role, self.peers, hooks, *args, self.roles.wait_for_master)
        self.chunks = ChunkSender(net, self.counters, on_chunks)
        self._nursery: trio.Nursery | None = None
        self._wire()

    def _wire(self) -> None:
        """Who tells whom: master changes, heartbeats showing a gap, applied events, a replaced log."""
        self.roles.catch_up = self.log.fetch_from
        self.outbox.gossip_reaches = self.peers.direct.gossip_reaches
        self.roles.on_change += [self.outbox.on_master_change, lambda _m: self.peers.beat_now.set(), self._master_changed]
        self.peers.on_master_ahead = self.log.wake
        self.peers.on_duplicate = self._stop
        # first listener: the apply time is taken before other listeners run
        self.replica.listeners.insert(0, lambda e, _s: self.event_times.applied(e.idx))
        self.replica.listeners += [self.outbox.on_applied, self._applied]
        self.replica.snapshot_listeners += [self.outbox.on_log_replaced, self.mesh.reannounce_all]

    def _master_changed(self, master: str | None) -> None:
        self.log.master_changed(master)  # the tail is checked again before gossip is taken

    def _applied(self, _event: IndexedEvent, _state: object) -> None:
        if not self.role.is_master:
            self.peers.ack_applied()  # a few followers tell the master promptly that we applied (commit rule)

    def _stop(self) -> None:
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        net, hooks = self.net, self.settings.fault_hooks
        net.set_request_handler(LOG_PROTOCOL, self.log.serve)
        net.set_request_handler(COMMAND_PROTOCOL, self.commands.serve, timeout=self.settings.command_timeout + defaults.COMMAND_SERVE_SLACK)
        net.set_request_handler(CHUNKS_PROTOCOL, self.chunks.serve)
        net.set_request_handler(HEARTBEAT_PROTOCOL, self.peers.direct.serve)
        net.set_request_handler(LOCAL_EVENTS_PROTOCOL, self.sequencer.serve_local_events)
        heartbeats = await net.subscribe(HEARTBEATS_TOPIC, include_own=True, buffer=defaults.HEARTBEATS_BUFFER)
        local = await net.subscribe(LOCAL_EVENTS_TOPIC, buffer=defaults.LOCAL_EVENTS_BUFFER)
        indexed = await net.subscribe(GLOBAL_EVENTS_TOPIC, buffer=defaults.GLOBAL_EVENTS_BUFFER)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self.peers.run, heartbeats)
            nursery.start_soon(self.sequencer.run, with_gossip_faults(local, hooks, LOCAL_EVENTS_TOPIC, self.counters.add))
            nursery.start_soon(self.log.run, with_gossip_faults(indexed, hooks, GLOBAL_EVENTS_TOPIC, self.counters.add))
            for loop in (self.roles.run, self.outbox.run, self.mesh.run, self.chunks.run):
                nursery.start_soon(loop)
            task_status.started()

    # --- the facade: what the node and the API use ---------------------------------------------
    @property
    def master(self) -> str | None:
        return self.role.master

    @property
    def term(self) -> int:
        return self.role.term

    @property
    def is_master(self) -> bool:
        return self.role.is_master

    @property
    def liveness(self):  # type: ignore[no-untyped-def]
        return self.peers.liveness

    @property
    def duplicate_identity(self) -> str | None:
        return self.peers.duplicate_identity

    @property
    def origin_boot(self) -> str:
        return self.outbox.origin_boot

    @property
    def local_events_pending(self) -> int:
        """How many local events were sent to the master and not yet seen indexed."""
        return len(self.outbox.pending)

    def own_heartbeat(self) -> Heartbeat:
        return self.peers.own_heartbeat()

    def live_peers(self) -> list[Heartbeat]:
        return self.peers.live_peers()

    def reachable_nodes(self) -> set[str]:
        return self.peers.reachable_nodes()

    def alone_for(self) -> float | None:
        return self.peers.alone_for()

    def last_seen(self, node_id: str) -> float | None:
        return self.peers.last_seen(node_id)

    def send_local(self, event: Event) -> None:
        self.outbox.send(event)

    async def command(self, command: Command, timeout: float | None = None) -> CommandResult:
        return await self.commands.command(command, timeout)

    def send_chunk(self, destination: str, chunk: Chunk, seq: int) -> None:
        self.chunks.send(destination, chunk, seq)

    async def publish_indexed(self, indexed: IndexedEvent) -> None:
        await self.sequencer.publish_indexed(indexed)

    async def wait_committed(self, idx: int) -> None:
        await self.sequencer.wait_committed(idx)

    async def wait_for_master(self, timeout: float) -> str | None:
        return await self.roles.wait_for_master(timeout)
