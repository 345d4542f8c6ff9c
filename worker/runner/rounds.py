"""A serving multi-rank runner's turn and its agreement rounds (docs/architecture.md#rules).

Once Ready, generation tasks, cancels and Shutdown are held by the runner's ``TaskAgreement``
and decided in rounds every rank runs at the same points: before each step that accepts or
prefills, every ``check_every`` decode steps, every ``IDLE_ROUND_INTERVAL`` seconds when idle
(``worker.runner.pace``). A round is one all-gather; a collective that fails raises out of
``serve_round`` and fails the runner.
"""

from __future__ import annotations

import queue
import time
from typing import TYPE_CHECKING

from worker.runner.pace import IDLE_ROUND_INTERVAL, check_every_for, round_seconds
from worker.runner.protocol import INPUT_CLOSED

if TYPE_CHECKING:
    from worker.runner.main import RunnerProcess


def serve_round(runner: RunnerProcess) -> int | None:
    """One turn of a serving multi-rank runner: take input, run an agreement round when
    this is an agreement point (identical on every rank), do one generation step.
    Returns an exit code, or None to go on."""
    assert runner.engine is not None and runner.agreement is not None and runner.all_gather is not None
    busy = runner.engine.has_work()
    deadline = time.monotonic() + (0.0 if busy else IDLE_ROUND_INTERVAL)
    while True:
        wait = deadline - time.monotonic()
        try:
            item = runner.tasks.get(timeout=wait) if wait > 0 else runner.tasks.get_nowait()
        except queue.Empty:
            break
        if item is INPUT_CLOSED:
            return 0
        code = runner.handle_item(item)
        if code is not None:
            return code
    if not busy or runner.engine.in_prefill or runner.steps_since_round >= runner.check_every:
        with runner.pulse.unit("round"):
            code = agreement_round(runner)
        if code is not None:
            return code
    if runner.engine.has_work():
        decoding = not runner.engine.in_prefill
        started = time.monotonic()
        runner.step_generation()
        if decoding:
            runner.decode_steps += 1
            runner.decode_seconds += time.monotonic() - started
        runner.steps_since_round += 1
    return None


def agreement_round(runner: RunnerProcess) -> int | None:
    """One agreement round (a collective): start, cancel and drop what every rank agreed;
    0 when the ranks agreed to shut down."""
    assert runner.engine is not None and runner.agreement is not None and runner.all_gather is not None
    result = runner.agreement.round(runner.all_gather, pace_proposal(runner), hold=runner.pacer.hold)
    runner.steps_since_round, runner.decode_steps, runner.decode_seconds = 0, 0, 0.0
    runner.engine.slots.hold_long = result.hold  # the same on every rank (worker.runner.prefill_pace)
    if result.check_every > 0:
        runner.check_every = result.check_every
    for task in result.start:
        runner.engine.submit(task.task_id, task.params)
    for task_id in result.cancel:
        runner.engine.cancel(task_id)
    for task in result.dropped:
        runner.end_cancelled(task.task_id)
    if result.shutdown:
        runner.shut_down()
        return 0
    return None


def pace_proposal(runner: RunnerProcess) -> int:
    """Decode steps this rank proposes until the next round, from the decode steps it
    timed since the last round (0: none timed, no proposal)."""
    if runner.decode_steps == 0 or runner.decode_seconds <= 0:
        return 0
    assert runner.setup is not None
    return check_every_for(runner.decode_steps / runner.decode_seconds, round_seconds(runner.setup.engine.max_batch))
