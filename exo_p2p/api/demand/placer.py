"""Placement on demand: a request naming a model the cluster knows but has no ready instance
of places one with the normal rules, waits for it, then is served (docs/models.md
"Placement on demand and idle unload").

``DemandPlacer.ready`` is the one wait every family's request goes through (generation,
embeddings, Ollama's preload). Its rules:

- Concurrent first requests cause one placement: on this node, requests for a model being
  placed wait for the placement already sent; across nodes, the master answers a
  ``PlaceInstance(on_demand=True)`` with the model's existing instance instead of placing a
  second one (``master.commands``).
- The wait is bounded (``wait_bound``, ``DEMAND_WAIT``), polled from State every
  ``POLL_INTERVAL`` seconds with ``tick()`` called between polls (a stream's keep-alive).
- A placement that fails (no cycle fits: the placement's explanation) is answered 503
  ``code="placement_failed"`` and remembered for ``NEGATIVE_TTL`` seconds: requests for that
  model within that time get the same answer at once, without another placement.
- A placement refused only because instances serving a request hold the room
  (``placement_busy``, ``master.handover.PlacementBusy``) is answered 503 ``placement_busy``
  with ``Retry-After`` and not remembered: a request once they are idle places it. The
  requests waiting on this node for that placement get the same answer.
- An instance that fails while it loads is answered 503 with its reason; failed instances are
  never placed again here (``master.replace`` re-places them), only a model with none.
- A request that finds an instance placed by hand loading keeps the 503 ``loading`` with
  ``Retry-After`` (``waits``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog
import trio

from exo_p2p.api.backend import ApiBackend
from exo_p2p.state.views import instance_view
from exo_p2p.types import ErrorInfo, PlaceInstance, State, new_id

log = structlog.get_logger("exo_p2p.api")

DEMAND_WAIT = 300.0
"""Seconds a request waits at most for the instance placed on demand to be ready (loading a
model from disk, or fetching it from a peer, then loading it)."""
NEGATIVE_TTL = 30.0
"""Seconds a failed placement on demand is answered from memory, not tried again."""
POLL_INTERVAL = 0.25
"""Seconds between two looks at State while waiting."""
MAX_PLACEMENTS = 2
"""Placements one request sends at most (a second one when its instance vanished meanwhile,
e.g. unloaded while idle before this node's State showed it)."""


def waits(error: ErrorInfo, state: State, model_id: str) -> bool:
    """Whether a ``SubmitTask`` refused with ``error`` waits for a placement on demand: the
    model has no instance (``model_not_placed``), or one placed on demand is loading
    (``loading``). One placed by hand that loads keeps its 503 and ``Retry-After``."""
    if error.code == "model_not_placed":
        return True
    return error.code == "loading" and any(
        inst.model_id == model_id and (u := state.usage.get(i)) is not None and u.on_demand for i, inst in state.instances.items())


def ready_instance(state: State, model_id: str) -> str | None:
    """The id of a ready instance of ``model_id`` in ``state`` (the smallest), or None."""
    ready = [i for i, inst in state.instances.items() if inst.model_id == model_id and instance_view(state, inst).status == "ready"]
    return min(ready) if ready else None


def waiting_on(state: State, model_id: str) -> tuple[str | None, ErrorInfo | None]:
    """While waiting for ``model_id``: (an instance loading, None), or (None, the error to
    answer, worded as the master's ``instance_failed``: every instance failed), or (None, None)
    when there is no instance at all."""
    views = [instance_view(state, inst) for inst in state.instances.values() if inst.model_id == model_id]
    loading = sorted(v.instance.instance_id for v in views if v.status != "failed")
    if loading:
        return loading[0], None
    if views:
        reasons = "; ".join(sorted(v.reason or "failed" for v in views))
        return None, ErrorInfo(503, f"no healthy instance for model {model_id!r}: {reasons}",
                               "server_error", "model", "instance_failed")
    return None, None


def refusal(model_id: str, error: ErrorInfo) -> ErrorInfo:
    """What a request answers when the master refused its placement on demand with ``error``:
    a 400 becomes 503 ``placement_failed`` (remembered, ``NEGATIVE_TTL``), or ``placement_busy``
    when only instances serving a request are in the way (not remembered, ``Retry-After``);
    other errors as they are."""
    if error.code == "placement_busy":
        return ErrorInfo(503, f"model {model_id!r} cannot be placed on demand while other models serve requests: "
                         f"{error.message}", "server_error", "model", "placement_busy")
    if error.status == 400 or error.code == "placement_failed":
        return ErrorInfo(503, f"model {model_id!r} cannot be placed on demand: {error.message}",
                         "server_error", "model", "placement_failed")
    return error


@dataclass
class DemandPlacer:
    """One API's placements on demand: its node default keep-alive (seconds; negative:
    forever) for the instances it places, the negative cache and the placements under way."""

    keep_alive: float = 300.0
    wait_bound: float = DEMAND_WAIT
    negative_ttl: float = NEGATIVE_TTL
    failed: dict[str, tuple[float, ErrorInfo]] = field(default_factory=dict)
    """Model id → (until, error), trio clock (``NEGATIVE_TTL``)."""
    placing: dict[str, tuple[trio.Event, list[ErrorInfo]]] = field(default_factory=dict)
    """Model id → (set when the placement under way is answered, its error if any)."""
    outcomes: dict[str, int] = field(default_factory=lambda: {"placed": 0, "reused": 0, "failed": 0})
    """``PlaceInstance(on_demand=True)`` this API sent, by the master's answer: ``placed`` (a new
    instance), ``reused`` (one already loading or ready, e.g. another node's placement),
    ``failed`` (refused, or no answer); metrics ``exo_placements_on_demand_total``."""

    @property
    def placed(self) -> int:
        """New instances this API placed on demand (``GET /state``'s ``placements_on_demand``)."""
        return self.outcomes["placed"]

    async def ready(self, backend: ApiBackend, model_id: str, keep_alive: float | None,
                    tick: Callable[[], Awaitable[None]]) -> ErrorInfo | None:
        """Wait until ``model_id`` has a ready instance, placing one when there is none
        (``keep_alive``: the request's, else this node's). None when ready; else the error
        to answer (503 ``placement_failed``, ``instance_failed`` or ``timeout``; a 404 of an
        unknown model as the master gave it)."""
        now = trio.current_time()
        cached = self.failed.get(model_id)
        if cached is not None and cached[0] > now:
            return cached[1]
        deadline = now + self.wait_bound
        placements = 0
        while trio.current_time() < deadline:
            state = backend.state()
            if ready_instance(state, model_id) is not None:
                return None
            loading, failure = waiting_on(state, model_id)
            if failure is not None:  # every instance failed: master.replace re-places them, or gave up
                return failure
            if loading is None and placements < MAX_PLACEMENTS:  # none at all (or unloaded meanwhile)
                placements += 1
                error = await self._place(backend, model_id, keep_alive)
                if error is not None:
                    return error
            await trio.sleep(POLL_INTERVAL)  # this node's State shows the placement a moment later
            await tick()
        return ErrorInfo(503, f"model {model_id!r} was placed on demand but was not ready within {self.wait_bound:g} s; "
                         "retry shortly", "server_error", "model", "timeout")

    async def _place(self, backend: ApiBackend, model_id: str, keep_alive: float | None) -> ErrorInfo | None:
        """Send one ``PlaceInstance(on_demand=True)`` for ``model_id``, or wait for the one
        this API already sent; a refusal is remembered (``NEGATIVE_TTL``)."""
        under_way = self.placing.get(model_id)
        if under_way is not None:
            await under_way[0].wait()
            return under_way[1][0] if under_way[1] else None
        done, answer = self.placing[model_id] = (trio.Event(), [])
        try:
            keep = keep_alive if keep_alive is not None and keep_alive > 0 else self.keep_alive
            command = PlaceInstance(new_id(), model_id, keep_alive=keep, on_demand=True)
            result = await backend.command(command, timeout=60.0)
            if result.error is None:
                new = result.instance is not None and result.instance.instance_id == command.command_id
                self.outcomes["placed" if new else "reused"] += 1
                log.info("api.placed_on_demand", model=model_id, instance_id=result.instance and result.instance.instance_id)
                return None
            error = refusal(model_id, result.error)
            self.outcomes["failed"] += 1
            if error.code == "placement_failed":
                self.failed[model_id] = (trio.current_time() + self.negative_ttl, error)
            answer.append(error)
            return error
        finally:
            del self.placing[model_id]
            done.set()
