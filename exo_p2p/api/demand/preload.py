"""Ollama's load and unload idioms (docs/models.md "Placement on demand and idle unload"): a
``/api/chat`` or ``/api/generate`` request with no messages or prompt loads the model (placed
on demand and waited for, as a generation would be) and answers ``done_reason: "load"``; with
``keep_alive: 0`` it unloads the model instead (``done_reason: "unload"``): its instances
that carry a keep-alive get keep-alive 0, so the master unloads each once no request runs on
it (``master.idle``). Instances placed by hand with no keep-alive, and pinned ones, stay.
"""

from __future__ import annotations

from exo_p2p.api.backend import ApiBackend
from exo_p2p.api.demand.keep_alive import parse_keep_alive
from exo_p2p.api.demand.placer import DemandPlacer, waiting_on
from exo_p2p.api.errors import ApiError
from exo_p2p.types import PlaceInstance, new_id


async def _nothing() -> None:
    return None


async def load_or_unload(backend: ApiBackend, placer: DemandPlacer | None, model_id: str, keep_alive: float | None) -> str:
    """Load (or, ``keep_alive == 0``, unload) ``model_id``; returns the Ollama ``done_reason``
    (``"load"`` or ``"unload"``). Raises ``ApiError`` with the placement's refusal (503).
    Without placement on demand (``placer`` None) a load is answered at once, nothing placed."""
    loading, _ = waiting_on(backend.state(), model_id)
    if keep_alive == 0:
        if loading is not None:
            await _record(backend, model_id, 0.0)
        return "unload"
    if placer is None:  # --no-place-on-demand: answered at once, as before placement on demand
        return "load"
    error = await placer.ready(backend, model_id, keep_alive, _nothing)
    if error is not None:
        raise ApiError(error.status, error.message, param=error.param, code=error.code)
    if keep_alive is not None:
        await _record(backend, model_id, keep_alive)
    return "load"


async def _record(backend: ApiBackend, model_id: str, keep_alive: float) -> None:
    """Give ``model_id``'s instance ``keep_alive`` (a placement on demand the master answers
    with the existing instance and an ``InstanceUsed``; ``master.commands``)."""
    result = await backend.command(PlaceInstance(new_id(), model_id, keep_alive=keep_alive, on_demand=True), timeout=30.0)
    if result.error is not None:
        raise ApiError(result.error.status, result.error.message, param=result.error.param, code=result.error.code)


def request_keep_alive(value: object) -> float | None:
    """A request's ``keep_alive`` in seconds (``exo_p2p.api.demand.keep_alive``); raises
    ``ApiError(400)`` naming the field when it does not parse."""
    try:
        return parse_keep_alive(value)
    except ValueError as exc:
        raise ApiError(400, str(exc), param="keep_alive", code="invalid_keep_alive") from None
