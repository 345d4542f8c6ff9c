"""Tasks this node submitted whose request is gone here: cancel them (what a long-lived
cluster needs).

A task's ``api_node_id`` owns its client connection. When that connection is gone but the
task is still unfinished in State, nobody will read its tokens, yet its runner decodes them
to the token limit (or the context), holding a batch row and a place in the instance's
queue. That happens when this node restarted mid-generation (the new process has no
request for the old task), or when the API's own cancel after a client disconnect did not
reach a master (one try, bounded, during a failover). The master cancels the tasks of an
API node that timed out (``master.reactions``); this rule covers a node that is still, or
again, a member.

``orphans(...)`` is pure: an unfinished task of this node, not cancelled yet, with no open
request here for ``ORPHAN_GRACE`` seconds is due for ``CancelGeneration``. The grace covers
the moments a request is legitimately not open while its task is still listed: the API
closes its route on the task's last chunk, a little before the task's removal is applied
here. ``OrphanSweeper`` runs it every ``SWEEP_INTERVAL`` seconds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Container, Mapping

import structlog
import trio

from exo_p2p.types import FINISHED_TASK_STATUSES, CancelGeneration, CommandResult, State, TaskRecord, new_id

log = structlog.get_logger(__name__)

ORPHAN_GRACE = 10.0
"""Seconds a task of this node may be listed with no open request here before it is
cancelled (and between two cancels of the same task when one got no answer)."""

SWEEP_INTERVAL = 2.0
"""Seconds between two sweeps."""

CANCELS_PER_SWEEP = 16
"""At most this many cancels per sweep (each waits for the master, ``CANCEL_TIMEOUT``)."""

CANCEL_TIMEOUT = 5.0
"""Seconds one cancel may wait for a master's answer."""


def orphans(tasks: Mapping[str, TaskRecord], node_id: str, open_requests: Container[str],
            since: Mapping[str, float], now: float, grace: float = ORPHAN_GRACE) -> tuple[list[str], dict[str, float]]:
    """``(due, since')``: the task ids to cancel now (sorted, at most ``CANCELS_PER_SWEEP``)
    and, for every orphan of this node, when it was first seen without a request
    (``since`` carried over; a due task's entry restarts at ``now``, so a cancel that got
    no answer is sent again after another ``grace``). ``tasks``: State's tasks;
    ``open_requests``: task ids with a request open here; seconds on one monotonic clock."""
    first: dict[str, float] = {}
    due: list[str] = []
    for task_id, record in sorted(tasks.items()):
        if (record.task.api_node_id != node_id or task_id in open_requests or record.cancel_requested
                or record.status in FINISHED_TASK_STATUSES):
            continue
        first[task_id] = since.get(task_id, now)
        if now - first[task_id] >= grace and len(due) < CANCELS_PER_SWEEP:
            due.append(task_id)
            first[task_id] = now
    return due, first


class OrphanSweeper:
    """``run()``: every ``SWEEP_INTERVAL`` s, cancel this node's orphaned tasks (``orphans``).

    ``state()``: the replicated State; ``open_requests()``: task ids with a request open
    here; ``command(cmd, timeout)``: send a command to the master."""

    def __init__(self, node_id: str, state: Callable[[], State], open_requests: Callable[[], Container[str]],
                 command: Callable[[CancelGeneration, float], Awaitable[CommandResult]]) -> None:
        self.node_id = node_id
        self._state, self._open, self._command = state, open_requests, command
        self._since: dict[str, float] = {}
        self.cancelled = 0
        """Orphaned tasks this node asked to cancel."""

    async def sweep(self) -> list[str]:
        """One sweep; returns the task ids it asked to cancel."""
        due, self._since = orphans(self._state().tasks, self.node_id, self._open(), self._since, trio.current_time())
        for task_id in due:
            log.info("cancelling a task whose request is gone", task_id=task_id)
            self.cancelled += 1
            try:
                result = await self._command(CancelGeneration(command_id=new_id(), task_id=task_id), CANCEL_TIMEOUT)
            except Exception as exc:  # noqa: BLE001 - tried again after another grace
                log.warning("cancel of an orphaned task failed", task_id=task_id, error=repr(exc))
                continue
            if result.error is not None:
                log.warning("cancel of an orphaned task refused", task_id=task_id, error=result.error.message)
        return due

    async def run(self) -> None:
        while True:
            await trio.sleep(SWEEP_INTERVAL)
            await self.sweep()
