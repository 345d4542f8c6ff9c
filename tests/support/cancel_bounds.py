"""The bound on how soon a cancelled generation stops, shared by the cancel tests."""

from __future__ import annotations


CANCEL_BOUND = 5.0
"""Seconds from closing a stream until its task left State on every node, at this machine's quiet
speed (the next agreement round, then the master's event gossiped); a slower run gets more:
``cancel_bound``."""


def cancel_bound(per_token: float, quiet: float = CANCEL_BOUND) -> float:
    """``quiet``, or, on a run that decodes slowly, twice the ``MAX_CHECK_EVERY`` + 1 decode
    steps the next agreement round can be away at the measured seconds per token."""
    from worker.runner.pace import MAX_CHECK_EVERY

    return max(quiet, 2 * (MAX_CHECK_EVERY + 1) * per_token)
