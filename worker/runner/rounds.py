"""A serving multi-rank runner's agreement rounds (docs/architecture.md#rules).

Once Ready, work tasks, cancels and Shutdown are held by ``Rounds`` (its ``TaskAgreement``)
and decided in rounds every rank runs at the same points: before each step at the engine's
agreement point (``Engine.must_agree``: it would start or prefill work), every
``check_every`` decode steps, every ``IDLE_ROUND_INTERVAL`` seconds when idle
(``worker.runner.pace``). A round is one all-gather; a collective that fails raises out of
``round`` and fails the runner. ``Rounds`` knows the engine only through the seam
(``worker.engine.base.Engine``) and the runner not at all: the runner asks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from exo_p2p.types import TaskId, WorkTask
from worker.engine.agreement import TaskAgreement
from worker.engine.base import Engine, Gather
from worker.runner.pace import check_every_for, round_seconds


@dataclass
class RoundOutcome:
    """What a round decided that the runner must report: tasks ended Cancelled before they
    started (``dropped``), and whether the ranks agreed to shut down."""

    dropped: list[TaskId] = field(default_factory=list)
    shutdown: bool = False


class Rounds:
    """One rank's rounds: the agreement, the pace (``check_every`` decode steps between
    rounds, agreed) and the decode steps timed since the last round. ``max_batch``: the
    batch limit the pace is computed for (``worker.runner.pace.round_seconds``)."""

    def __init__(self, all_gather: Gather, max_batch: int, check_every: int = 1) -> None:
        self.all_gather, self.max_batch = all_gather, max_batch
        self.agreement: TaskAgreement[WorkTask] = TaskAgreement()
        self.check_every = check_every
        self.steps_since_round = 0
        self._decode_steps, self._decode_seconds = 0, 0.0

    @classmethod
    def agreed(cls, all_gather: Gather, max_batch: int, rate: float) -> Rounds:
        """The rounds of a rank whose engine warmed up at ``rate`` decode steps per second:
        the pace is the slowest rank's (a collective: every rank calls it once, after warm-up)."""
        proposal = np.array([check_every_for(rate, round_seconds(max_batch))], dtype=np.int64)
        return cls(all_gather, max_batch, int(all_gather(proposal).min()))

    def add(self, task: WorkTask) -> bool:
        """Hold ``task`` until the ranks agree it. False when a round already cancelled it
        (the runner ends it Cancelled at once)."""
        added = self.agreement.add(task.task_id, task.created_idx, task)
        return added or not self.agreement.was_cancelled(task.task_id)

    def want_cancel(self, task_id: TaskId) -> None:
        self.agreement.want_cancel(task_id)

    def want_shutdown(self) -> None:
        self.agreement.want_shutdown()

    def finished(self, task_id: TaskId) -> None:
        self.agreement.finished(task_id)

    def due(self, engine: Engine) -> bool:
        """Whether a round comes before the next step (identical on every rank)."""
        return not engine.has_work() or engine.must_agree() or self.steps_since_round >= self.check_every

    def round(self, engine: Engine) -> RoundOutcome:
        """One round (a collective): start, cancel and drop what every rank agreed."""
        result = self.agreement.round(self.all_gather, self._proposal(), hold=engine.hold_proposal())
        self.steps_since_round, self._decode_steps, self._decode_seconds = 0, 0, 0.0
        engine.agreed_hold(result.hold)  # the same on every rank (worker.runner.prefill_pace)
        if result.check_every > 0:
            self.check_every = result.check_every
        for task in result.start:
            engine.submit(task)
        for task_id in result.cancel:
            engine.cancel(task_id)
        return RoundOutcome([t.task_id for t in result.dropped], result.shutdown)

    def stepped(self, seconds: float, decoding: bool) -> None:
        """A step took ``seconds``; ``decoding``: it only decoded (it is timed for the pace)."""
        if decoding:
            self._decode_steps += 1
            self._decode_seconds += seconds
        self.steps_since_round += 1

    def _proposal(self) -> int:
        """Decode steps this rank proposes until the next round, from the decode steps it
        timed since the last round (0: none timed, no proposal)."""
        if self._decode_steps == 0 or self._decode_seconds <= 0:
            return 0
        return check_every_for(self._decode_steps / self._decode_seconds, round_seconds(self.max_batch))
