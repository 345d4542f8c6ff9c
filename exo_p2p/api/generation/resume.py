"""When a generation's task fails, whether and how its request moves (pure rules).

The requesting node's API knows every token it has sent to the client, so it is the one that
moves a request: on a failure of the task's instance (a node or runner died, chunks were
lost on the way) it submits a continuation task — the same parameters, ``resume_tokens`` =
the token ids already sent, ``origin_task_id`` = the request's first task — to whichever
ready instance of the model the master picks (another instance, or the re-placement of the
failed one once it is ready). The runner prefills prompt + those tokens, replays them through
its detokenizer and stop matcher and continues (``worker.engine.prepare``), so the client
sees one uninterrupted answer: no repeated or missing text, usage as without the failure.

Rules (``on_failure``, ``on_refusal``):

- only failures of the serving side move: the router's ``ErrorChunk`` with
  ``code="generation_failed"`` (status 503: instance failed, task lost, chunks lost), and a
  runner's 500 (an exception while generating, e.g. "[ring] connection to a peer was lost"
  when another rank's node died) when the task's instance fails within ``FAIL_WAIT``
  seconds of it (``suspect``): the cluster, not the request, failed then. A runner's 500
  whose instance stays healthy (the model's own error), a 400 (a prompt beyond the
  context), a timeout waiting for output (504) or a refusal are answered as before;
- a request moves at most ``max_moves`` times (default ``MAX_MOVES``); one more failure is
  answered with that failure's error;
- a continuation the master refuses because nothing is ready yet (503 while the
  re-placement loads or has not been made, 429 queue full, a master unreachable during a
  failover) is submitted again every ``RETRY_INTERVAL`` seconds until ``MOVE_BOUND`` seconds
  after the failure — longer, up to ``PROGRESS_BOUND``, while the re-placement visibly
  progresses (``exo_p2p.api.generation.replacement_progress``: layers loading on a busy machine); then — or at once when the model was given up (every instance of it
  failed for good: no placement left), deleted or is unknown, or the refusal is one retrying
  cannot fix (4xx but 429) — the request ends with the failure's error (the one it would have
  had without moving), its message naming why it could not move.

A request that has not started yet — its submission is refused with a 503 because the
model's only instances failed and their re-placement loads (``code="loading"`` or
``"instance_failed"``) — waits for it the same way (``waits_for_replacement``): submitted
again every ``RETRY_INTERVAL`` seconds until ``MOVE_BOUND`` seconds, with keep-alives, so a
request not yet started is not lost to the failure either. A model that is loading for the first time (no
failure behind it) is still answered 503 at once, with ``Retry-After``.

No clock, no I/O: callers pass seconds on any monotonic clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from exo_p2p.api.generation.replacement_progress import PROGRESS_BOUND, PROGRESS_FRESH
from exo_p2p.types import ErrorInfo, State

MAX_MOVES = 2
"""Moves of one request at most (a node setting: ``--max-moves``)."""

MOVE_BOUND = 60.0
"""Seconds after a failure within which a continuation must be accepted by a ready instance
(covers a node's 5 s timeout, the re-placement's backoff and a small model's load); after it
the client gets the failure's error."""

RETRY_INTERVAL = 0.5
"""Seconds between two submissions of a continuation the master refused for now."""

FAIL_WAIT = 12.0
"""Seconds a runner's 500 waits for its instance to fail (a dead node is timed out after 5 s;
slack for a loaded machine) before it is answered as the model's own error."""

MOVABLE_CODE = "generation_failed"
"""``ErrorInfo.code`` of the failures of the serving side (``exo_p2p.chunks.router``)."""


@dataclass(frozen=True)
class Move:
    """Submit a continuation with ``resume_tokens`` (the token ids sent so far)."""

    resume_tokens: tuple[int, ...]


@dataclass(frozen=True)
class Retry:
    """Submit the continuation again after ``delay`` seconds."""

    delay: float


@dataclass(frozen=True)
class GiveUp:
    """End the request with ``error``."""

    error: ErrorInfo


def movable(error: ErrorInfo) -> bool:
    """Whether ``error`` is a failure of the serving side (a continuation may succeed)."""
    return error.code == MOVABLE_CODE and error.status == 503


def suspect(error: ErrorInfo) -> bool:
    """Whether ``error`` may be a failure of the serving side: a runner's 500 (it moves when
    the task's instance fails within ``FAIL_WAIT`` seconds)."""
    return error.status == 500


def instance_failed(state: State, instance_id: str | None) -> bool:
    """Whether ``instance_id`` failed or is gone from ``state`` (None: unknown, False)."""
    if instance_id is None:
        return False
    instance = state.instances.get(instance_id)
    return instance is None or instance.failed_reason is not None


def on_failure(error: ErrorInfo, sent_tokens: tuple[int, ...], moves: int, max_moves: int) -> Move | GiveUp:
    """What to do when the current task of a request ends with ``error``, after ``moves``
    moves so far, ``sent_tokens`` having reached the client: ``Move`` or ``GiveUp(error)``."""
    if not movable(error):
        return GiveUp(error)
    if moves >= max_moves:
        if max_moves == 0:  # moving is off: the error as it was
            return GiveUp(error)
        return GiveUp(_with_reason(error, f"not moved again: already moved {moves} times (at most {max_moves})"))
    return Move(tuple(sent_tokens))


def on_refusal(
    failure: ErrorInfo, refusal: ErrorInfo, *, waited: float, bound: float = MOVE_BOUND, given_up: bool = False,
    progress_age: float | None = None,
) -> Retry | GiveUp:
    """What to do when the master refuses a continuation with ``refusal``, ``waited``
    seconds after ``failure``; ``given_up``: the model has no placement left
    (``model_given_up``). Waits only for refusals that a ready instance will end; past
    ``bound`` only while the re-placement progresses (``progress_age``: seconds since its last
    visible progress, None: nothing on its way; ``exo_p2p.api.generation.replacement_progress``), up to
    ``PROGRESS_BOUND``."""
    if given_up:
        return GiveUp(_with_reason(failure, f"could not move: {refusal.message}"))
    if refusal.status not in (429, 503) or refusal.code == "out_of_memory":
        return GiveUp(_with_reason(failure, f"could not move: {refusal.message}"))
    if waited + RETRY_INTERVAL > bound:
        progressing = progress_age is not None and progress_age <= PROGRESS_FRESH
        if not progressing:
            return GiveUp(_with_reason(failure, f"could not move within {bound:g} s: {refusal.message}"))
        if waited + RETRY_INTERVAL > max(bound, PROGRESS_BOUND):
            return GiveUp(_with_reason(failure, f"could not move within {max(bound, PROGRESS_BOUND):g} s "
                                                f"(the re-placement was still progressing): {refusal.message}"))
    return Retry(RETRY_INTERVAL)


def model_given_up(state: State, model_id: str) -> bool:
    """Whether ``model_id`` has instances and every one failed for good (given up: no
    re-placement will come)."""
    instances = [i for i in state.instances.values() if i.model_id == model_id]
    return bool(instances) and all(i.gave_up for i in instances)


def replacement_coming(state: State, model_id: str) -> bool:
    """Whether an instance of ``model_id`` is on its way back after a failure: a
    re-placement (``replaces`` set) that has not failed, or a failed instance the master will
    still re-place (not given up)."""
    for inst in state.instances.values():
        if inst.model_id != model_id:
            continue
        if inst.failed_reason is None and inst.replaces is not None:
            return True
        if inst.failed_reason is not None and not inst.gave_up:
            return True
    return False


def waits_for_replacement(refusal: ErrorInfo, state: State, model_id: str) -> bool:
    """Whether a new request refused with ``refusal`` waits (and is submitted again) rather
    than answered: a 503 ``loading`` / ``instance_failed`` while ``replacement_coming``."""
    return refusal.status == 503 and refusal.code in ("loading", "instance_failed") and replacement_coming(state, model_id)


def _with_reason(error: ErrorInfo, reason: str) -> ErrorInfo:
    return ErrorInfo(error.status, f"{error.message}; {reason}", error.type, error.param, error.code)


@dataclass
class MoveCounters:
    """What one API's moves did: ``moved`` continuations accepted, ``failed`` requests that
    ended with an error after a movable failure (not moved or could not move)."""

    moved: int = 0
    failed: int = 0
