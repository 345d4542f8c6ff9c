"""The models this node holds, as the cluster hears of them: the cards listed from its
model store (its models dirs, pulled models, Ollama and LM Studio: docs/models.md#model-stores),
published as ``NodeModelsUpdated`` at start, after a pull or a removal, and whenever a
periodic re-listing finds a change."""

from __future__ import annotations

from collections.abc import Callable

import structlog
import trio

from exo_p2p.models.stores.store import REFRESH_SECONDS
from exo_p2p.types import Event, ModelCard, NodeModelsUpdated

log = structlog.get_logger("exo_p2p.node")


class LocalModels:
    """The model cards of this node's store (``cards``, as last listed) and their publishing
    through ``emit`` (the node's local events). ``store`` is an
    ``exo_p2p.models.stores.store.ModelStore`` (its ``list_cards`` runs in a thread)."""

    def __init__(self, store, node_id: str, emit: Callable[[Event], None]) -> None:  # type: ignore[no-untyped-def]
        self.store = store
        self.node_id = node_id
        self._emit = emit
        self.cards: list[ModelCard] = []

    def publish(self) -> None:
        """Publish ``cards`` as this node's models."""
        self._emit(NodeModelsUpdated(self.node_id, tuple(self.cards)))  # type: ignore[arg-type]

    async def load(self) -> None:
        """List the store's cards and publish them (at start, after a pull or a removal).
        Raises what the store's listing raises."""
        self.cards = await trio.to_thread.run_sync(self.store.list_cards)
        self.publish()

    async def watch(self) -> None:
        """Re-list this node's models every ``REFRESH_SECONDS`` (as the depot re-scans) and
        publish them when they changed: a model downloaded into Ollama, LM Studio or a models
        dir while the node runs is listed (docs/models.md#model-stores). Cheap when nothing
        changed: cards are cached by their files' paths, sizes and mtimes. A failed listing is
        logged and tried again at the next pass; never returns."""
        while True:
            await trio.sleep(REFRESH_SECONDS)
            try:
                cards = await trio.to_thread.run_sync(self.store.list_cards)
            except Exception as exc:  # a scan failure must not stop the node
                log.warning("model re-listing failed", error=repr(exc))
                continue
            if cards != self.cards:
                self.cards = cards
                self.publish()
