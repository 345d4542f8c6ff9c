"""Command handling: the master's pure decision for each command (docs/architecture.md#request-flow).

``handle_command(state, command) -> Decision``: the events to sequence and the answer for
the caller. No I/O; the master role sequences the events, waits for them to commit and only
then sends the answer.
"""

from __future__ import annotations

import msgspec

from exo_p2p.state.views import instance_view
from exo_p2p.types import (
    CancelGeneration,
    Command,
    CommandResult,
    DeleteInstance,
    ErrorInfo,
    Event,
    FinishGeneration,
    Instance,
    PlaceInstance,
    RankSettings,
    State,
    SubmitTask,
    TaskCancelRequested,
    TaskCreated,
    TaskDeleted,
    TaskStatusUpdated,
    TextGeneration,
)
from master.admission import memory_refusal
from master.handover import PlacementBusy, place_with_handover
from master.idle import on_demand_existing, placement_usage, unload_events, use_events
from master.in_flight import busy_refusal
from master.placement.place import PlacementError, place_instance
from master.placement.context import resolve_nodes
from master.restore import draining
from master.routing import Option, choose
from exo_p2p.content.prefixes import longest_match, prefix_chain
from master.task_kinds import oversized_input, prefill_tokens, split_refusal, unsupported_task


class Decision(msgspec.Struct, frozen=True):
    """Events to sequence (in order) and the result to answer once they are committed."""

    events: tuple[Event, ...]
    result: CommandResult


def _error(command: Command, status: int, message: str, *, type_: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> Decision:
    return Decision((), CommandResult(command.command_id, error=ErrorInfo(status, message, type_, param, code)))


def handle_command(
    state: State, command: Command, *, queue_limit: int | None = None, rank_settings: RankSettings | None = None,
    unreachable: frozenset[str] = frozenset(), routing: str = "prefix", now: float = 0.0,
) -> Decision:
    """Decide what ``command`` does on ``state``.

    - ``PlaceInstance``: unknown model → 404; placement failure → 400 with the placement's
      reason (numbers in GiB and bytes; code ``placement_busy`` when it fits once the
      instances serving a request are idle, ``master.handover``), or an encoder placed on more than one node
      (``master.task_kinds.split_refusal``); else ``InstanceCreated``, the instance carrying
      ``rank_settings`` (the master's: what every rank must share, ``RankSettings``). A
      ``command_id`` already an instance of State (the instance id is the command id: the
      caller retried after a lost answer or across a failover) is answered with that
      instance and no event: a second placement would count the first one's memory against
      itself (a false "does not fit") or overwrite the instance's shards, leaving the first
      shards' runners holding memory for an instance that no longer lists them. With a
      ``keep_alive``, ``pin`` or ``on_demand``, an ``InstanceUsed`` at ``now`` (unix s) records
      its keep-alive (``master.idle``); ``on_demand`` with an instance of the model already
      there (not failed) answers that one, no event: concurrent first requests, one placement.
      A placement that does not fit unloads idle instances first, least recently used first
      (``master.handover``: never one serving, pinned or kept until deleted).
    - ``DeleteInstance``: unknown id → 404; else ``InstanceDeleted`` plus a failed status for
      each of its unfinished tasks (their clients get an error).
    - ``SubmitTask`` (any kind of work, ``master.task_kinds``): unknown model → 404; a kind
      the model cannot do (``ModelCard.tasks``) → 400 ``unsupported_task``; no instance → 409 (how to place it); no
      ready instance → 503 (``code="loading"`` while one loads, else the failure reason);
      no ready instance whose ranks have the free memory for the prompt → 503
      ``code="out_of_memory"`` (``master.admission``: memory admission); ``queue_limit`` unfinished
      tasks on the chosen instance → 429; else ``TaskCreated`` on the ready instance, among
      those with the memory, that ``master.routing.choose`` picks: the one holding the
      longest prefix of the request unless it is much busier, else the least loaded (ties:
      instance id; see ``instance_load``; ``routing="load"``: load alone; the answer's
      ``route`` says which),
      preferring instances with no shard on an ``unreachable`` node (one the master does
      not hear right now: dead but not timed out yet, e.g. the master just killed), and
      never a shrunk instance whose full-size successor is ready (``master.restore``). A
      ``task_id`` already in State (the caller retried across a failover after the former
      master had decided it) is answered with that task's instance and no event: a second
      ``TaskCreated`` would move the running task's record to another instance, and its
      runner's status reports would then be refused. An instance with a keep-alive also gets
      an ``InstanceUsed`` at ``now`` (with the request's ``keep_alive``; ``master.idle``).
    - ``CancelGeneration``: ``TaskCancelRequested`` for a known unfinished task; an unknown
      task is tolerated (it may have just finished): success, no event.
    - ``FinishGeneration``: marks a known task finished and removes it (and its instance's
      keep-alive counts from ``now``); unknown → success.
    """
    if isinstance(command, PlaceInstance):
        return _place(state, command, rank_settings, now)
    if isinstance(command, DeleteInstance):
        return _delete(state, command)
    if isinstance(command, SubmitTask):
        return _submit(state, command, queue_limit, unreachable, routing, now)
    if isinstance(command, CancelGeneration):
        record = state.tasks.get(command.task_id)
        if record is None or record.status in ("complete", "failed", "cancelled") or record.cancel_requested:
            return Decision((), CommandResult(command.command_id))
        return Decision((TaskCancelRequested(command.task_id),), CommandResult(command.command_id))
    if isinstance(command, FinishGeneration):
        return _finish(state, command, now)
    raise TypeError(f"unknown command {type(command).__name__}")


def _finish(state: State, command: FinishGeneration, now: float) -> Decision:
    if command.task_id not in state.tasks:
        return Decision((), CommandResult(command.command_id))
    status = command.status if command.status in ("complete", "failed", "cancelled") else "complete"
    used = use_events(state, state.tasks[command.task_id].task.instance_id, now, None, task=False)
    return Decision(
        (TaskStatusUpdated(command.task_id, status), TaskDeleted(command.task_id), *used),  # type: ignore[arg-type]
        CommandResult(command.command_id),
    )


def unknown_model_message(model: str, known: str) -> str:
    """The one wording of a model the cluster does not know, for a placement and a request
    alike (the CLI shows it as is): ``unknown model NAME; models in the cluster: A, B``."""
    return f"unknown model {model[:200]}; models in the cluster: {known}"


def _place(state: State, command: PlaceInstance, rank_settings: RankSettings | None = None, now: float = 0.0) -> Decision:
    placed = state.instances.get(command.command_id)
    if placed is None and command.on_demand and (existing := on_demand_existing(state, command.model_id)) is not None:
        return Decision(use_events(state, existing.instance_id, now, command.keep_alive, task=True),
                        CommandResult(command.command_id, instance=existing))
    if placed is not None:  # a retry of a placement already decided: the same answer
        if placed.model_id != command.model_id:
            return _error(command, 409, f"instance id {command.command_id!r} is already an instance of model {placed.model_id!r}",
                          param="command_id", code="instance_exists")
        return Decision((), CommandResult(command.command_id, instance=placed))
    card = state.model_cards.get(command.model_id)
    if card is None:
        known = ", ".join(sorted(state.model_cards)) or "none"
        return _error(command, 404, unknown_model_message(command.model_id, known), type_="not_found_error", param="model", code="model_not_found")
    try:
        required = resolve_nodes(state, command.nodes) if command.nodes else None
        instance, gone = place_with_handover(state, lambda s: place_instance(  # idle instances make room: master.handover
            s, card, min_nodes=command.min_nodes, sharding=command.sharding, nodes=required, instance_id=command.command_id,
            split=command.split))
    except PlacementError as exc:  # placement_busy: fits once the instances serving a request are idle
        return _error(command, 400, str(exc), code="placement_busy" if isinstance(exc, PlacementBusy) else "placement_failed")
    if (split := split_refusal(card, instance)) is not None:
        return _error(command, 400, split, code="placement_failed")
    from exo_p2p.types import InstanceCreated

    if rank_settings is not None:
        instance = msgspec.structs.replace(instance, settings=rank_settings)

    usage = placement_usage(command, now)
    unloads = [e for instance_id in gone for e in unload_events(state, instance_id, "room")]
    return Decision((*unloads, InstanceCreated(instance), *usage), CommandResult(command.command_id, instance=instance))


def _delete(state: State, command: DeleteInstance) -> Decision:
    if command.instance_id not in state.instances:
        return _error(command, 404, f"unknown instance {command.instance_id!r}", type_="not_found_error", param="instance_id")
    return Decision(unload_events(state, command.instance_id), CommandResult(command.command_id, instance_id=command.instance_id))


def instance_load(state: State, instance: Instance) -> float:
    """How full ``instance`` is: its unfinished tasks (sequences in flight or queued) ÷ its
    batch limit (``RankSettings.max_batch``; 1 for an instance placed without settings),
    so an instance decoding 8 of 16 is as loaded as one serving 1 of 2."""
    limit = instance.settings.max_batch if instance.settings is not None else 1
    return _unfinished(state, instance.instance_id) / max(1, limit)


def _unfinished(state: State, instance_id: str) -> int:
    return sum(
        1
        for r in state.tasks.values()
        if r.task.instance_id == instance_id and r.status not in ("complete", "failed", "cancelled")
    )


def _submit(state: State, command: SubmitTask, queue_limit: int | None,
            unreachable: frozenset[str] = frozenset(), routing: str = "prefix", now: float = 0.0) -> Decision:
    existing = state.tasks.get(command.task_id)
    if existing is not None:  # a retry of a submission already decided: the same answer
        return Decision((), CommandResult(command.command_id, instance_id=existing.task.instance_id))
    model = command.model_id
    if model not in state.model_cards:
        known = ", ".join(sorted(state.model_cards)) or "none"
        return _error(command, 404, unknown_model_message(model, known), type_="not_found_error", param="model", code="model_not_found")
    if (unsupported := unsupported_task(state.model_cards[model], command.task)) is not None:
        return Decision((), CommandResult(command.command_id, error=unsupported))
    instances = [i for i in state.instances.values() if i.model_id == model]
    if not instances:
        return _error(
            command,
            409,
            f"model {model!r} is not placed on any node; place it first: `exo-p2p place {model}` or POST /instances {{\"model\": \"{model}\"}}",
            param="model",
            code="model_not_placed",
        )
    views = [instance_view(state, i) for i in instances]
    ready = [v.instance for v in views if v.status == "ready"]
    switching = draining(state)  # shrunk instances whose full-size successor is ready (master.restore)
    ready = [i for i in ready if i.instance_id not in switching] or ready
    if not ready:
        loading = [v for v in views if v.status == "loading"]
        if loading:
            v = loading[0]
            return _error(
                command, 503, f"model {model!r} is loading ({v.layers_loaded}/{v.layers_total} layers); retry shortly", type_="server_error", code="loading"
            )
        reasons = "; ".join(v.reason or "failed" for v in views)
        return _error(command, 503, f"no healthy instance for model {model!r}: {reasons}", type_="server_error", code="instance_failed")
    card = state.model_cards[model]
    if (too_long := oversized_input(card, command.task)) is not None:
        return Decision((), CommandResult(command.command_id, error=too_long))
    tokens = prefill_tokens(card, command.task)
    refusals = {i.instance_id: memory_refusal(state, i, card, tokens) for i in ready}
    fitting = [i for i in ready if refusals[i.instance_id] is None]
    if not fitting:
        first = min(refusals.items())[1]
        return _error(command, 503, str(first), type_="server_error", param="messages", code="out_of_memory")
    heard = [i for i in fitting if not any(sh.node_id in unreachable for sh in i.shards)]
    chosen, route = _route(state, heard or fitting, command, routing)
    if queue_limit is not None and _unfinished(state, chosen.instance_id) >= queue_limit:
        return _error(
            command, 429, f"queue full: {queue_limit} requests are already queued for model {model!r}; retry later", type_="rate_limit_error", code="queue_full"
        )
    if (busy := busy_refusal(state, command.task.params)) is not None:
        return _error(command, 429, busy, type_="rate_limit_error", code="cluster_busy")
    task = msgspec.structs.replace(command.task, instance_id=chosen.instance_id, created_idx=0)
    used = use_events(state, chosen.instance_id, now, command.keep_alive, task=True)
    return Decision((TaskCreated(task), *used), CommandResult(command.command_id, instance_id=chosen.instance_id, route=route))


def _route(state: State, pool: list[Instance], command: SubmitTask, routing: str) -> tuple[Instance, str]:
    """The instance of ``pool`` to serve ``command`` and why (``master.routing``)."""
    if len(pool) == 1:
        return pool[0], "only"
    prefixed = routing == "prefix" and isinstance(command.task, TextGeneration)  # only generations reuse prefixes
    chain = prefix_chain(command.task.params) if prefixed else []
    options = [Option(i.instance_id, instance_load(state, i), longest_match(chain, state.prefixes.get(i.instance_id, ())))
               for i in pool]
    chosen_id, reason = choose(options)
    return next(i for i in pool if i.instance_id == chosen_id), reason
