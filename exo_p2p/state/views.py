"""Read-only views derived from State (instance status, serving instances)."""

from __future__ import annotations

import msgspec

from exo_p2p.types import (
    SERVING_STATUSES,
    Instance,
    InstanceStatus,
    RunnerDownloading,
    RunnerFailed,
    RunnerLoading,
    State,
)


class InstanceView(msgspec.Struct, frozen=True):
    """An instance with its derived status (docs/architecture.md#instance-lifecycle): ``loading`` while some runner is
    not Ready/Running, ``ready`` when all are, ``failed`` with ``reason``. ``layers_loaded``
    / ``layers_total`` sum the loading progress of its runners. ``downloads`` has, per rank
    (``None`` when the rank is not Downloading), its ``RunnerDownloading`` status: bytes of
    its shard fetched from peers, of total, and speed (docs/models.md)."""

    instance: Instance
    status: InstanceStatus
    reason: str | None
    layers_loaded: int
    layers_total: int
    runner_statuses: tuple[str, ...]
    downloads: tuple[RunnerDownloading | None, ...] = ()


def instance_view(state: State, instance: Instance) -> InstanceView:
    """Derive the status of ``instance`` from the runner records in ``state``."""
    total = sum(s.end_layer - s.start_layer for s in instance.shards)
    loaded = 0
    statuses: list[str] = []
    downloads: list[RunnerDownloading | None] = []
    ready = True
    failed_reason = instance.failed_reason
    for shard in instance.shards:
        record = state.runners.get(shard.runner_id)
        if record is None:
            statuses.append("pending")
            downloads.append(None)
            ready = False
            continue
        status = record.status
        downloads.append(status if isinstance(status, RunnerDownloading) else None)
        statuses.append(type(status).__struct_config__.tag)  # type: ignore[attr-defined]
        if isinstance(status, RunnerFailed) and failed_reason is None:
            failed_reason = f"runner {shard.runner_id} (rank {shard.rank} on {shard.node_id}) failed: {status.error}"
        if isinstance(status, RunnerLoading):
            loaded += status.layers_loaded
        elif not isinstance(status, (RunnerFailed,)) and _past_loading(status):
            loaded += shard.end_layer - shard.start_layer
        if not isinstance(status, SERVING_STATUSES):
            ready = False
    if failed_reason is not None:
        return InstanceView(instance, "failed", failed_reason, loaded, total, tuple(statuses), tuple(downloads))
    return InstanceView(instance, "ready" if ready else "loading", None, loaded, total, tuple(statuses), tuple(downloads))


def _past_loading(status: object) -> bool:
    tag = type(status).__struct_config__.tag  # type: ignore[attr-defined]
    return tag in ("loaded", "warming_up", "ready", "running")


def instances_of_model(state: State, model_id: str) -> list[InstanceView]:
    """Views of every instance of ``model_id``, in instance id order."""
    return [instance_view(state, inst) for _, inst in sorted(state.instances.items()) if inst.model_id == model_id]
