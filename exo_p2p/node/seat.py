"""The master role as this node holds it: built (``master.role.MasterRole``) when the
cluster member elects this node, run in the node's nursery, cancelled when another master
wins. The cluster core drives it through ``MasterHooks`` and knows nothing of ``master``
(docs/architecture.md#layers); a composition module, like ``exo_p2p.node``."""

from __future__ import annotations

import trio

from exo_p2p.cluster.member import ClusterMember
from exo_p2p.cluster.settings import MasterHooks
from exo_p2p.config import NodeConfig
from exo_p2p.replica import Replica
from exo_p2p.types import Command, CommandResult, ErrorInfo, Event, LocalEvent, MasterElected, NodeId
from master.role import MasterRole


class MasterSeat:
    """Holds this node's ``MasterRole`` while it is master (``role``, else None).
    ``bind(member, nursery)`` before the member can start the role; ``hooks`` are what the
    member calls. While not master, local events are ignored, commands answered 503
    ``not_master`` and emits count 0 events."""

    def __init__(self, node_id: str, replica: Replica, config: NodeConfig) -> None:
        self.node_id = NodeId(node_id)
        self.replica = replica
        self.config = config
        self.role: MasterRole | None = None
        self.hooks = MasterHooks(start=self.start, stop=self.stop, accept_local=self.accept_local,
                                 command=self.command, emit=self.emit)
        self._bound: tuple[ClusterMember, trio.Nursery] | None = None
        self._scope: trio.CancelScope | None = None

    def bind(self, member: ClusterMember, nursery: trio.Nursery) -> None:
        """Use ``member`` to publish and ``nursery`` to run the role (the member is built
        with this seat's ``hooks``, so it is handed over once both exist)."""
        self._bound = (member, nursery)

    @property
    def counters(self) -> dict[str, int]:
        """The role's counters (``GET /state``), empty while not master."""
        return self.role.counters if self.role is not None else {}

    async def start(self, term: int) -> None:
        """Become master in ``term``: sequence ``MasterElected`` first, then run the role's
        duties in the node's nursery until ``stop``. Raises ``RuntimeError`` before ``bind``."""
        if self._bound is None:
            raise RuntimeError("the master's seat is not bound to a cluster member yet")
        (member, nursery), cfg = self._bound, self.config
        self.role = MasterRole(
            self.node_id,
            term,
            self.replica,
            member.publish_indexed,
            wait_committed=member.wait_committed,
            queue_limit=cfg.queue_limit,
            reachable=member.reachable_nodes,
            heard_ago=member.last_seen,
            rank_settings=cfg.engine.rank_settings(),
            restore_size=cfg.restore_size,
            relink=cfg.relink,
            routing=cfg.routing,
            hub_card_idle=cfg.hub_card_idle,
        )
        await self.role.emit([MasterElected(self.node_id, term)])
        self._scope = trio.CancelScope()
        nursery.start_soon(self._run_duties, self.role, self._scope)

    async def _run_duties(self, role: MasterRole, scope: trio.CancelScope) -> None:
        with scope:
            await role.run()

    async def stop(self) -> None:
        """Stop sequencing: another master won."""
        self.role = None
        if self._scope is not None:
            self._scope.cancel()

    async def accept_local(self, local: LocalEvent) -> None:
        """Sequence a local event (ignored while not master)."""
        if self.role is not None:
            await self.role.accept_local(local)

    async def command(self, command: Command) -> CommandResult:
        """The role's answer to ``command``; a 503 ``not_master`` result while not master."""
        if self.role is None:
            return CommandResult(command.command_id, error=ErrorInfo(503, "not the master", "server_error", code="not_master"))
        return await self.role.command(command)

    async def emit(self, events: list[Event]) -> int:
        """Sequence ``events``; 0 while not master."""
        return await self.role.emit(events) if self.role is not None else 0
