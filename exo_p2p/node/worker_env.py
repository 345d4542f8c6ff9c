"""What the node takes from ``worker`` beyond the ``Worker`` itself: the environment of its
runners (the BLAS they use, ``worker.blas``) and the measure of its profile with its settings
bound (``worker.profile``). A composition module, like ``exo_p2p.node``."""

from __future__ import annotations

import os
from collections.abc import Callable

import msgspec

import structlog

from exo_p2p.config import NodeConfig
from exo_p2p.node.process import host_name
from exo_p2p.node.profile_publisher import Measure
from exo_p2p.types import FINISHED_TASK_STATUSES, NetworkAddress, NodeProfile, NodeSpeed, State
from worker import blas
from worker.profile import measure_profile

log = structlog.get_logger("exo_p2p.node")


def runner_environment(cpu_weights: str) -> dict[str, str]:
    """The environment of this node's runners (``worker.blas``), logged once at start:
    which BLAS they use and how many threads, or one warning naming the install command."""
    choice = blas.choose()
    if choice.library is not None:
        log.info("runners use an optimised BLAS", library=str(choice.library), threads=choice.threads, cpu_weights=cpu_weights)
    elif choice.warning is not None:
        log.warning(choice.warning)
    else:
        log.info("runners use MLX's own BLAS", cpu_weights=cpu_weights)
    return blas.runner_environment(os.environ, choice.library, choice.threads)


def node_idle(state: State, node_id: str) -> bool:
    """Whether no unfinished task runs on an instance with a shard on ``node_id`` (a
    calibration then competes with no runner: ``worker.calibrate.run``)."""
    mine = {i for i, inst in state.instances.items() if any(s.node_id == node_id for s in inst.shards)}
    return not any(r.task.instance_id in mine and r.status not in FINISHED_TASK_STATUSES for r in state.tasks.values())


def profile_measure(node_id: str, boot_id: str, cfg: NodeConfig, speed: Callable[[], NodeSpeed | None] = lambda: None) -> Measure:
    """``worker.profile.measure_profile`` with this node's identity and settings bound (its
    friendly name, or the host name as it is at each measure; its memory limit, priority and
    ``--cpu-weights``) and its latest measured ``speed`` (``worker.calibrate``)."""

    def measure(*, hosted_bytes: int, addrs: tuple[NetworkAddress, ...], models: tuple[str, ...]) -> NodeProfile:
        profile = measure_profile(node_id, boot_id, cfg.friendly_name or host_name(), memory_limit=cfg.memory_limit,
                                  hosted_bytes=hosted_bytes, addrs=addrs, models=models, priority=cfg.priority,
                                  cpu_weights=cfg.cpu_weights)
        return msgspec.structs.replace(profile, aliases=tuple(cfg.aliases),  # exo_p2p.api.demand.aliases
                                       max_loaded_models=cfg.max_loaded_models,  # master.handover
                                       speed=speed())  # master.placement.speed_split

    return measure
