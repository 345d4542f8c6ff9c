"""Automatic re-placement of failed instances (design.md §5b).

A failed instance is re-placed (new instance id, ``replaces`` = the failed one, ``attempt``
+ 1) after a backoff of ``BACKOFF_BASE * 2**attempt`` seconds, when the model fits
somewhere; after ``MAX_ATTEMPTS`` re-placements in a row that never served (a crash loop) it
is given up and its failure reason says why. An instance that served (every rank Ready
once) starts the count again when it fails, so a long-lived instance survives any number of
node restarts spread over its life. Deleting an instance is final (a deleted instance is not in State, so never re-placed).
The timing uses the master's monotonic clock only; the decisions are pure.
"""

from __future__ import annotations

import msgspec

from exo_p2p.types import Event, Instance, InstanceCreated, InstanceDeleted, InstanceFailed, State
from master.placement import PlacementError, place_instance

MAX_ATTEMPTS = 3
BACKOFF_BASE = 1.0
"""Seconds before the first re-placement; doubles with every attempt."""


def backoff(attempt: int) -> float:
    """Seconds to wait before re-placing an instance that failed on attempt ``attempt``."""
    return BACKOFF_BASE * (2**attempt)


def effective_attempt(failed: Instance) -> int:
    """Re-placements so far in the current crash loop: ``failed.attempt``, or 0 when the
    failed instance had served (every rank Ready once) — the count starts again then."""
    return 0 if failed.served else failed.attempt


def replacement(state: State, failed: Instance, new_instance_id: str) -> tuple[Event, ...]:
    """Events that re-place ``failed``: delete it and create its successor, or — when the
    attempts are used up or nothing fits — record that it was given up (the instance stays
    listed as failed with the reason; no runner is started)."""
    reason = failed.failed_reason or "failed"
    if failed.gave_up:
        return ()
    if effective_attempt(failed) >= MAX_ATTEMPTS:
        return (InstanceFailed(failed.instance_id, f"{reason}; not re-placed: gave up after {MAX_ATTEMPTS} re-placements", final=True),)
    card = state.model_cards.get(failed.model_id)
    if card is None:
        return (InstanceFailed(failed.instance_id, f"{reason}; not re-placed: model {failed.model_id!r} is no longer in the cluster", final=True),)
    try:
        new = place_instance(state, card, min_nodes=1, sharding=failed.sharding, instance_id=new_instance_id)
    except PlacementError as exc:
        try:  # fall back to any size that fits
            new = place_instance(state, card, min_nodes=1, sharding="pipeline", instance_id=new_instance_id)
        except PlacementError:
            return (InstanceFailed(failed.instance_id, f"{reason}; not re-placed: {exc}", final=True),)
    new = msgspec.structs.replace(new, replaces=failed.instance_id, attempt=effective_attempt(failed) + 1)
    return (InstanceDeleted(failed.instance_id), InstanceCreated(new))
