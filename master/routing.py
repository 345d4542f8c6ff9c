"""Which ready instance serves a request (pure; docs/operations.md#prefix-aware-routing).

Each instance publishes the digests of the prefixes its prompt cache holds
(``State.prefixes``, ``exo_p2p.content.prefixes``). ``choose`` takes, per candidate instance, its
load (unfinished tasks ÷ batch limit, ``master.commands.instance_load``) and how many
characters of the request's longest prefix it holds, and picks:

1. among the instances whose load is within ``slack`` of the least loaded one, the one
   holding the longest prefix (ties: the lesser load, then the instance id) — reason
   ``prefix:<chars>``;
2. when none of them holds any prefix, the least loaded (ties: the instance id), as before
   prefixes were known — reason ``load``, or ``load:busy`` when an instance holding a
   prefix was left out because it was more than ``slack`` busier.

So a prefix never sends a request to an instance more than ``slack`` busier than the least
loaded one: with ``slack`` 0.5, an instance decoding 16 of 16 loses to one decoding 7 of 16.
``routing="load"`` (``--routing load``) ignores prefixes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PREFIX_LOAD_SLACK = 0.5
"""Load (unfinished tasks ÷ batch limit) by which the instance holding a request's prefix
may exceed the least loaded one and still be chosen."""
ROUTINGS = ("prefix", "load")


@dataclass(frozen=True)
class Option:
    """One candidate: its instance id, its load (≥ 0) and the characters of the request's
    longest prefix it holds (0: none)."""

    instance_id: str
    load: float
    matched: int


def choose(options: Sequence[Option], slack: float = PREFIX_LOAD_SLACK) -> tuple[str, str]:
    """The instance id to serve the request and the reason (module docstring). Raises
    ``ValueError`` when ``options`` is empty or ``slack`` is negative."""
    if not options:
        raise ValueError("no instance to choose from")
    if slack < 0:
        raise ValueError(f"slack must be >= 0, not {slack}")
    least = min(o.load for o in options)
    eligible = [o for o in options if o.load <= least + slack]
    best = max(o.matched for o in eligible)
    if best > 0:
        chosen = min((o for o in eligible if o.matched == best), key=lambda o: (o.load, o.instance_id))
        return chosen.instance_id, f"prefix:{best}"
    chosen = min(options, key=lambda o: (o.load, o.instance_id))
    busy = any(o.matched > 0 for o in options)
    return chosen.instance_id, "load:busy" if busy else "load"
