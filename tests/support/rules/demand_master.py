"""A backend for ``exo_p2p.api.demand.placer.DemandPlacer`` whose commands the master's rules
decide on a one-node State (``master.commands.handle_command``), instances ready at once, or
refused with a given error; ``sent`` counts the commands, ``delay`` (s) holds each answer."""

from __future__ import annotations

import trio

from exo_p2p.types import CommandResult, ErrorInfo, RunnerReady, RunnerStatusUpdated, State
from master.commands import handle_command
from tests.support.rules.master_run import run

T0 = 1_700_000_000.0


def ready(s: State, instance) -> State:  # type: ignore[no-untyped-def]
    """``s`` with every runner of ``instance`` ready."""
    return run(s, [RunnerStatusUpdated(sh.runner_id, instance.instance_id, sh.node_id, RunnerReady()) for sh in instance.shards])


class DemandMaster:
    def __init__(self, state: State, refuse: ErrorInfo | None = None, delay: float = 0.0) -> None:
        self.s, self.refuse, self.delay, self.sent = state, refuse, delay, 0

    def state(self) -> State:
        return self.s

    async def command(self, command, timeout: float = 30.0) -> CommandResult:  # type: ignore[no-untyped-def]
        self.sent += 1
        await trio.sleep(self.delay)
        if self.refuse is not None:
            return CommandResult(command.command_id, error=self.refuse)
        d = handle_command(self.s, command, now=T0)
        if d.result.error is None and d.result.instance is not None:
            self.s = ready(run(self.s, d.events), d.result.instance)
        return d.result


async def no_tick() -> None:
    """A stream's keep-alive that sends nothing."""
