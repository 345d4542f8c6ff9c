"""The command client: a command reaches the master over a request/response stream and is
answered once its event is applied here; the master's side decides only for members.

Rules (``retry_pause``): a command is sent again, to whoever is master then, when the master
did not answer (``COMMAND_RETRY_PAUSE``), when the node asked is no longer master
(``NOT_MASTER_PAUSE``), and when the master refused this node as not a member while
``NOT_MEMBER_MIN_LEFT`` s of the command's time are left (this node's profile may not be
indexed yet); after ``command_timeout`` s without an answer: a 503 ``no_master`` result.
The master answers only members and their live followers (``command_access``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
import trio

from exo_p2p import defaults
from exo_p2p.cluster.command_access import NOT_MEMBER, command_refusal
from exo_p2p.cluster.common import Counters, Role
from exo_p2p.cluster.heartbeats import PeerView
from exo_p2p.cluster.messages import COMMAND_PROTOCOL, encode
from exo_p2p.cluster.settings import ClusterSettings, MasterHooks
from exo_p2p.replica import Replica
from exo_p2p.types import PROTOCOL_VERSION, Command, CommandEnvelope, CommandResult, ErrorInfo

command_envelope_decoder = msgspec.msgpack.Decoder(CommandEnvelope)
command_result_decoder = msgspec.msgpack.Decoder(CommandResult)


def retry_pause(result: CommandResult, time_left: float) -> float | None:
    """Seconds to wait before sending the command again after ``result``, or None: final."""
    code = result.error.code if result.error is not None else None
    if code == "not_master":
        return defaults.NOT_MASTER_PAUSE
    if code == NOT_MEMBER and time_left > defaults.NOT_MEMBER_MIN_LEFT:
        return defaults.COMMAND_RETRY_PAUSE
    return None


class CommandClient:
    """``command(cmd, timeout)`` (any node) and ``serve`` (the ``COMMAND_PROTOCOL`` handler)."""

    def __init__(self, net, replica: Replica, role: Role, peers: PeerView, hooks: MasterHooks,  # type: ignore[no-untyped-def]
                 settings: ClusterSettings, counters: Counters,
                 wait_for_master: Callable[[float], Awaitable[str | None]]) -> None:
        self.net, self.replica, self.role, self.peers, self.hooks = net, replica, role, peers, hooks
        self.settings, self.counters, self.wait_for_master = settings, counters, wait_for_master

    async def _ask(self, master: str, command: Command, deadline: float) -> CommandResult:
        envelope = CommandEnvelope(self.role.node_id, command)  # type: ignore[arg-type]
        timeout = max(0.1, deadline - trio.current_time())
        return command_result_decoder.decode(await self.net.request(master, COMMAND_PROTOCOL, encode(envelope), timeout=timeout))

    async def command(self, command: Command, timeout: float | None = None) -> CommandResult:
        """Send ``command`` to the master (retried across a failover) and return its result;
        a 503 result when no master answers within ``timeout`` seconds (default
        ``command_timeout``)."""
        deadline = trio.current_time() + (self.settings.command_timeout if timeout is None else timeout)
        last_error = "no master elected yet"
        while trio.current_time() < deadline:
            master = await self.wait_for_master(deadline - trio.current_time())
            if master is None:
                break
            if master == self.role.node_id:
                result = await self.hooks.command(command)
            else:
                try:
                    result = await self._ask(master, command, deadline)
                except Exception as exc:  # noqa: BLE001 - any failure: retry with the (new) master
                    last_error = f"master {master} did not answer: {exc}"
                    await trio.sleep(defaults.COMMAND_RETRY_PAUSE)
                    continue
            if (pause := retry_pause(result, deadline - trio.current_time())) is not None:
                if result.error is not None and result.error.code == NOT_MEMBER:
                    last_error = result.error.message
                await trio.sleep(pause)
                continue
            if result.event_idx:
                with trio.move_on_after(max(0.0, min(defaults.COMMAND_APPLY_WAIT, deadline - trio.current_time()))):
                    await self.replica.wait_for_idx(result.event_idx)
            return result
        error = ErrorInfo(503, f"the cluster has no reachable master: {last_error}", "server_error", code="no_master")
        return CommandResult(command.command_id, error=error)

    async def serve(self, peer: str, data: bytes) -> bytes:
        envelope = command_envelope_decoder.decode(data)
        if envelope.version != PROTOCOL_VERSION:
            raise ValueError(f"unsupported protocol version {envelope.version}")
        if not self.role.is_master:
            error = ErrorInfo(503, "not the master", "server_error", code="not_master")
            return encode(CommandResult(envelope.command.command_id, error=error))
        followers = {p.node_id for p in self.peers.live_peers() if p.master == self.role.node_id}
        refusal = command_refusal(peer, envelope.origin, self.replica.state.nodes, followers)
        if refusal is not None:
            self.counters.drop("command_not_member")
            error = ErrorInfo(403, refusal, "permission_error", code=NOT_MEMBER)
            return encode(CommandResult(envelope.command.command_id, error=error))
        return encode(await self.hooks.command(envelope.command))
