"""A model no node holds, made known to the cluster from a model hub
(docs/models.md#models-from-a-hub): its card and manifest read (``HubAccess.resolve``),
recorded in State as ``HubModelResolved``, before a placement of it goes to the master."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import trio

from exo_p2p.models.hub.client import is_repo_id, parse_repo
from exo_p2p.models.hub.manifest import hub_error_status, hub_error_text
from exo_p2p.state.hub_cards import card_too_large, hub_room
from exo_p2p.types import (Command, CommandResult, ErrorInfo, Event, HubModelResolved, ModelCard, NodeProfileUpdated,
                           PlaceInstance, State)

RESOLVED_WAIT = 15.0
"""Seconds to wait at most for a model read from a hub to be in State."""


class HubModels:
    """Reads models from a hub for this node's API. ``hub`` is an
    ``exo_p2p.models.hub.fetch.HubAccess``, ``depot`` the node's ``ModelDepot`` (where the
    hub's manifest is kept), ``state`` reads this node's State, ``emit`` sends a local event."""

    def __init__(self, hub, depot, node_id: str, state: Callable[[], State], emit: Callable[[Event], None]) -> None:  # type: ignore[no-untyped-def]
        self.hub = hub
        self.depot = depot
        self.node_id = node_id
        self._state = state
        self._emit = emit

    async def before_command(self, command: Command) -> tuple[Command, CommandResult | None]:
        """``(command, None)`` to send to the master: a placement of a model no node holds
        whose name is a hub repo id names the model as read from the hub (``read``); or
        ``(command, error result)`` naming why the hub cannot give it. Any other command,
        or a name that is no repo id, unchanged (the master answers 404)."""
        if not isinstance(command, PlaceInstance) or command.model_id in self._state().model_cards:
            return command, None
        model_id, error = await self.read(str(command.model_id))
        command = msgspec.structs.replace(command, model_id=model_id)
        return command, (CommandResult(command.command_id, error=error) if error is not None else None)

    async def read(self, name: str) -> tuple[str, ErrorInfo | None]:
        """``(model id, None)`` once model ``name`` (``ORG/NAME[@REV]``) is known to the
        cluster: read from a hub (its card and manifest, ``HubAccess.resolve``) and recorded
        in State (``HubModelResolved``, waited for at most ``RESOLVED_WAIT`` s) unless State
        has its card already; ``(name, None)`` unchanged for a name that is no repo id or a
        node that never asks a hub (still unknown); ``(repo id, error)`` when the hub cannot
        give it (gated, missing, unreachable, not MLX-format, 507 no room on disk:
        ``hub.manifest.hub_error_status``) or State may not take its card (``_refused``).
        Never raises for the hub's answer."""
        repo, ask = self._repo(name)
        if not ask:
            return repo, None
        if (full := _full(self._state(), repo)) is not None:  # before asking the hub anything
            return repo, full
        try:
            source, card = await self.hub.resolve(name, self.depot)
        except Exception as exc:  # the hub's answer, as one line for the caller
            return repo, _error(exc)
        refused = _refused(self._state(), repo, card)
        if refused is not None:
            return repo, refused
        self.publish_held()
        self._emit(HubModelResolved(self.node_id, card, source))  # type: ignore[arg-type]
        with trio.move_on_after(RESOLVED_WAIT):
            while repo not in self._state().hub_models:
                await trio.sleep(0.05)
        return repo, None

    async def preview(self, name: str) -> tuple[str, ErrorInfo | None]:
        """``(model id, None)`` once model ``name`` (``ORG/NAME[@REV]``) can be previewed: State
        has its card, or its card was read from a hub for this node only
        (``HubAccess.preview``, see ``previewed``) — nothing is written to State or disk: only a
        placement adds a hub model to the cluster (``read``). Otherwise as ``read``."""
        repo, ask = self._repo(name)
        if ask:
            try:
                await self.hub.preview(name)
            except Exception as exc:  # the hub's answer, as one line for the caller
                return repo, _error(exc)
        return repo, None

    def _repo(self, name: str) -> tuple[str, bool]:
        """``(model id, whether to ask the hub)`` of ``name``: its repo id, asked when State has
        no card of it; ``name`` itself, never asked, for a name that is no repo id or a node
        that never asks a hub."""
        if not is_repo_id(name) or not self.hub.enabled:
            return name, False
        repo, _ = parse_repo(name)
        return repo, repo not in self._state().model_cards

    def preview_state(self, state: State, model_id: str) -> State:
        """``state`` with the card and source ``preview`` read for ``model_id`` added, when State
        lacks its card: a local copy for computing previews, never emitted. ``state`` itself
        otherwise."""
        if model_id in state.model_cards or not self.hub.enabled:
            return state
        kept = self.hub.previewed(model_id)
        if kept is None:
            return state
        source, card = kept
        return msgspec.structs.replace(state, model_cards={**state.model_cards, model_id: card},
                                       hub_models={**state.hub_models, model_id: source})

    def publish_held(self) -> None:
        """Publish this node's profile now with the models its depot holds (they changed)."""
        profile = self._state().nodes.get(self.node_id)  # type: ignore[call-overload]
        if profile is not None:
            self._emit(NodeProfileUpdated(msgspec.structs.replace(profile, held_models=self.depot.held())))


def _refused(state: State, repo: str, card: ModelCard) -> ErrorInfo | None:
    """Why ``card``, read from a hub as ``repo``, may not enter ``state`` (State is bounded:
    ``exo_p2p.state.hub_cards``): 400 ``card_too_large``, else as ``_full``; None when it may."""
    if (why := card_too_large(card)) is not None:
        return ErrorInfo(400, why, "invalid_request_error", "model", code="card_too_large")
    return _full(state, repo)


def _full(state: State, repo: str) -> ErrorInfo | None:
    """507 ``hub_models_full`` when ``state`` has no room for a new hub model ``repo``
    (``hub_cards.hub_room``), else None."""
    if (why := hub_room(state, repo)) is not None:
        return ErrorInfo(507, why, "server_error", "model", code="hub_models_full")
    return None


def _error(exc: Exception) -> ErrorInfo:
    """A failed hub read as the error a client gets (``hub.manifest.hub_error_status``)."""
    status = hub_error_status(exc)
    return ErrorInfo(status, hub_error_text(exc), "server_error" if status >= 500 else "invalid_request_error",
                     "model", code="insufficient_storage" if status == 507 else None)
