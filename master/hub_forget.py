"""When the master forgets models read from a hub that nothing uses (docs/security.md;
the rule of what may be forgotten: ``exo_p2p.state.hub_cards``).

``HubForgetClock`` keeps, on the master only, since when (its own clock) each hub model has
been evictable. ``due`` returns those evictable for ``idle`` seconds at least; the master
emits them as one ``HubModelsForgotten`` event, so every node drops the same cards at the
same log index whatever its own clock says. A model that becomes used (placed, or held by a
node) again leaves the table and waits the whole time afresh once evictable again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exo_p2p.state.hub_cards import HUB_CARD_IDLE_S, evictable
from exo_p2p.types import State

MAX_FORGET_AT_ONCE = 64
"""Models one ``HubModelsForgotten`` names at most (the event stays small)."""


@dataclass
class HubForgetClock:
    """Since when each hub model has been evictable (seconds of the master's clock)."""

    idle: float = HUB_CARD_IDLE_S
    since: dict[str, float] = field(default_factory=dict)

    def due(self, state: State, now: float) -> tuple[str, ...]:
        """The hub models of ``state`` evictable since ``now - idle`` or earlier, sorted, at
        most ``MAX_FORGET_AT_ONCE``; records the newly evictable ones, drops the others."""
        free = set(evictable(state))
        self.since = {m: self.since.get(m, now) for m in free}
        return tuple(sorted(m for m, t in self.since.items() if now - t >= self.idle))[:MAX_FORGET_AT_ONCE]
