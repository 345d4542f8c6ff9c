"""``place`` when the master's answer is "the cluster did not confirm the change within 10 s;
retry" (HTTP 503, ``master.role``): on a busy host the placement is often confirmed a little
later and the instance appears, so a retry would only find it. ``place`` then looks for the
instance for ``LATE_WAIT`` seconds and goes on with it; only when none appears does it fail
(saying that nothing was placed and to run it again)."""

from __future__ import annotations

import time

from exo_p2p.cli.errors import ApiError, CliError
from exo_p2p.cli.node_api.client import NodeClient

LATE_WAIT = 15.0
"""Seconds ``place`` looks for an instance whose placement the cluster did not confirm in time."""
POLL_SECONDS = 0.5
"""Seconds between two looks at ``GET /instances``."""
NOT_CONFIRMED = "the cluster did not confirm the change"
"""The start of the master's message for a command it sequenced but saw no quorum confirm in time."""


def is_unconfirmed(error: ApiError) -> bool:
    """Whether ``error`` is the master's 503 for a change not confirmed in time."""
    return error.status == 503 and error.message.startswith(NOT_CONFIRMED)


def late_instance(client: NodeClient, model: str, before: set[str], error: ApiError, wait: float | None = None) -> dict:
    """The instance of ``model`` not among the ids ``before`` (those listed before ``place``
    asked) that appears within ``wait`` seconds (None: ``LATE_WAIT``) after the unconfirmed
    answer ``error``. Raises ``CliError`` when none appears: nothing was placed, run
    ``place`` again."""
    wait = LATE_WAIT if wait is None else wait
    deadline = time.monotonic() + wait
    while True:
        for inst in client.instances():
            if inst.get("model") == model and str(inst.get("instance_id")) not in before:
                return inst
        if time.monotonic() >= deadline:
            raise CliError(f"{error.message}: no instance of {model} appeared within {wait:g} s after it, so "
                           f"nothing was placed; run `exo-p2p place {model}` again")
        time.sleep(POLL_SECONDS)
