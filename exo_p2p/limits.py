"""The process's open-file limit: raised at start, kept for good, and the budget of connections.

Every TCP connection (API clients, libp2p peers, model transfers), runner pipe and open file
is a descriptor, bounded by ``RLIMIT_NOFILE``. Two things threaten it:

- **A library lowers it.** mlx-lm (``mlx_lm/utils.py``, imported by every ``import mlx_lm``)
  calls ``resource.setrlimit(RLIMIT_NOFILE, (2048, 4096))`` at import: soft *and* hard limit,
  and a process that is not root can never raise a hard limit again. A node imports mlx-lm
  lazily (a tokenizer for ``count_tokens``, a model card its source does not answer), a runner
  always, so the limit fell to 2,048 at some moment after start.
- **Distros start processes at a low soft limit** (often 1,024) under a much higher hard one.

So :func:`keep_nofile`, called first thing in the node and runner processes (before anything
can import mlx-lm), does three things:

1. :func:`guard_setrlimit` replaces ``resource.setrlimit`` by a wrapper that never lowers the
   NOFILE limits (:func:`kept_nofile`): a call that would lower them sets what it may (it can
   still raise them) and is logged once with its caller. Patching the module attribute is
   enough because mlx-lm calls ``resource.setrlimit`` through the module; a library that
   calls the C function directly is not stopped, which is why step 3 exists.
2. raises the soft limit to the hard one (:func:`wanted_soft`; ``NOFILE_CEILING`` when the
   hard limit is unlimited) and logs both.
3. :func:`check_nofile` (called again after model code is imported) re-reads the limits: a
   lowered soft limit is raised back, a lowered hard one is logged as an error (it cannot be
   undone).

The budget (:func:`api_connection_cap`): ``FD_RESERVE`` descriptors stay for the node's own
files, runners and outgoing connections, ``LIBP2P_MAX_CONNECTIONS``, the bulk and the link probe
budgets for those listeners, and the API gets the rest, at most ``API_MAX_CONNECTIONS``.
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable

import structlog

log = structlog.get_logger(__name__)

Limits = tuple[int, int]
"""(soft, hard) as ``resource.getrlimit`` returns them; ``resource.RLIM_INFINITY`` (-1 on
Linux) is unlimited."""

NOFILE_CEILING = 65536
"""Soft NOFILE limit the node asks for when its hard limit is unlimited (descriptors)."""
FD_RESERVE = 1024
"""Descriptors kept out of the listeners' budget: the node's log and event log, model files,
runner pipes, outgoing libp2p and ring connections, threads' wake-up pipes."""
API_MAX_CONNECTIONS = 4096
"""HTTP connections the API serves at once at most (more are closed on arrival)."""
API_MIN_CONNECTIONS = 64
"""HTTP connections the API serves at once even when the descriptor budget is smaller."""
LIBP2P_MAX_INBOUND = 256
"""Inbound libp2p connections being handled at once at most (``exo_p2p.net.host_build``)."""
LIBP2P_MAX_CONNECTIONS = 300
"""Established libp2p connections, inbound and outbound, at most (py-libp2p's default)."""
BULK_MAX_CONNECTIONS = 80
"""Descriptors budgeted for the model-transfer (bulk) listener: its connections waiting for a
ticket and those served (``exo_p2p.models.transfer.bulk.MAX_UNREDEEMED`` + ``MAX_CONNECTIONS``)."""
PROBE_MAX_CONNECTIONS = 80
"""Descriptors budgeted for the link probe listener: its connections waiting for a ticket and
those served (``exo_p2p.links.probe_server.MAX_WAITING`` + ``MAX_CONNECTIONS``)."""

_state: dict[str, object] = {}
"""``original``: the unpatched ``resource.setrlimit``; ``kept``: the limits set at start."""


def _rank(value: int) -> float:
    return float("inf") if value == resource.RLIM_INFINITY or value < 0 else float(value)


def kept_nofile(requested: Limits, current: Limits) -> Limits:
    """What a guarded ``setrlimit(RLIMIT_NOFILE, requested)`` sets given the ``current``
    (soft, hard): each of them the larger of requested and current (never lowered), the soft
    one no larger than the hard one. Pure."""
    hard = max(requested[1], current[1], key=_rank)
    soft = max(requested[0], current[0], key=_rank)
    return (min(soft, hard, key=_rank), hard)


def wanted_soft(current: Limits, ceiling: int = NOFILE_CEILING) -> int:
    """The soft NOFILE limit to ask for: the hard limit, or ``max(soft, ceiling)`` when the
    hard one is unlimited. Never lower than the current soft limit. Pure."""
    soft, hard = current
    if _rank(hard) == float("inf"):
        return soft if _rank(soft) >= ceiling else ceiling
    return max(soft, hard, key=_rank)


def api_connection_cap(nofile_soft: int) -> int:
    """HTTP connections the API may hold at once under a soft NOFILE limit of ``nofile_soft``
    descriptors: what is left after ``FD_RESERVE`` and the libp2p, bulk and link probe
    listeners' caps,
    clamped to [``API_MIN_CONNECTIONS``, ``API_MAX_CONNECTIONS``]. Pure."""
    if _rank(nofile_soft) == float("inf"):
        return API_MAX_CONNECTIONS
    left = nofile_soft - FD_RESERVE - LIBP2P_MAX_CONNECTIONS - BULK_MAX_CONNECTIONS - PROBE_MAX_CONNECTIONS
    return max(API_MIN_CONNECTIONS, min(API_MAX_CONNECTIONS, left))


def _caller() -> str:
    frame = sys._getframe(2)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def guarded(original: Callable[[int, Limits], None], getrlimit: Callable[[int], Limits]) -> Callable[[int, Limits], None]:
    """A ``setrlimit(which, limits)`` that passes other resources to ``original`` unchanged
    and sets ``RLIMIT_NOFILE`` to :func:`kept_nofile` of the request and ``getrlimit``'s
    current limits (nothing when that changes nothing; logged when the request was lowered).
    Raises what ``original`` raises (``ValueError``, ``OSError``)."""

    def setrlimit(which: int, limits: Limits) -> None:
        if which != resource.RLIMIT_NOFILE:
            return original(which, limits)
        current = getrlimit(resource.RLIMIT_NOFILE)
        kept = kept_nofile((int(limits[0]), int(limits[1])), current)
        if kept != (limits[0], limits[1]):
            log.info("kept the open-file limit a library asked to lower", asked=list(limits), kept=list(kept),
                     caller=_caller())
        if kept != current:
            original(which, kept)

    return setrlimit


def guard_setrlimit() -> None:
    """Replace ``resource.setrlimit`` by :func:`guarded` (``RLIMIT_NOFILE`` is never lowered;
    see the module docstring). Idempotent; never raises."""
    if "original" in _state:
        return
    _state["original"] = resource.setrlimit
    resource.setrlimit = guarded(resource.setrlimit, resource.getrlimit)  # type: ignore[assignment]


def _set(limits: Limits) -> None:
    setter = _state.get("original", resource.setrlimit)
    setter(resource.RLIMIT_NOFILE, limits)  # type: ignore[operator]


def keep_nofile(where: str = "start") -> Limits:
    """Guard ``setrlimit``, raise the soft NOFILE limit to :func:`wanted_soft` and log the
    limits (``where`` names the process). Returns the (soft, hard) in force; never raises (a
    refused raise is logged and the current limits are kept)."""
    guard_setrlimit()
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted_soft(before)
    if target != before[0]:
        try:
            _set((target, before[1]))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit", asked=target, error=str(exc))
    now = resource.getrlimit(resource.RLIMIT_NOFILE)
    _state["kept"] = now
    log.info("open-file limit", where=where, soft=now[0], hard=now[1], was=list(before),
             api_connections=api_connection_cap(now[0]))
    return now


def check_nofile(where: str) -> Limits:
    """Re-read the NOFILE limits (after ``where``, e.g. model code was imported) against those
    :func:`keep_nofile` set: a lowered soft limit is raised back (logged), a lowered hard one
    is logged as an error. Returns the (soft, hard) in force; never raises."""
    now = resource.getrlimit(resource.RLIMIT_NOFILE)
    kept = _state.get("kept")
    if not isinstance(kept, tuple) or now == kept:
        return now
    if _rank(now[1]) < _rank(kept[1]):
        log.error("the open-file hard limit was lowered and cannot be raised again", where=where,
                  hard=now[1], was=kept[1])
    if _rank(now[0]) < _rank(kept[0]):
        try:
            _set((min(kept[0], now[1], key=_rank), now[1]))
        except (ValueError, OSError) as exc:
            log.warning("cannot restore the open-file limit", where=where, error=str(exc))
        log.warning("open-file soft limit was lowered; restored", where=where, was=now[0])
    now = resource.getrlimit(resource.RLIMIT_NOFILE)
    _state["kept"] = now
    return now
