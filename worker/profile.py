"""This node's profile: memory, CPU, OS, addresses, compute backend and ``--cpu-weights``
(docs/architecture.md#request-flow ``--memory-limit``)."""

from __future__ import annotations

import os
import platform

import psutil

from exo_p2p.types import NetworkAddress, NodeProfile


def capped_memory(physical_total: int, physical_available: int, limit: int | None, hosted_bytes: int) -> tuple[int, int]:
    """``(memory_total, memory_available)`` in bytes under a memory limit (docs/architecture.md#rules):
    ``total = min(physical total, L)``, ``available = min(physical available, L − bytes of
    the shards this node hosts)``, never below 0. Without a limit, physical values."""
    if limit is None:
        return physical_total, physical_available
    return min(physical_total, limit), max(0, min(physical_available, limit - hosted_bytes))


def compute_backend(system: str | None = None, machine: str | None = None) -> str:
    """Where this node's runners compute: ``"metal"`` on Apple-silicon macOS (MLX's GPU
    backend), else ``"cpu"`` (the ``mlx[cpu]`` wheel)."""
    system = system or platform.system()
    machine = machine or platform.machine()
    return "metal" if system == "Darwin" and machine in ("arm64", "aarch64") else "cpu"


def published_cpu_weights(backend: str, cpu_weights: str) -> str:
    """The ``cpu_weights`` a node publishes: its ``--cpu-weights`` on a CPU node, ``"stored"``
    on a Metal node (expanding helps only the CPU's BLAS)."""
    return cpu_weights if backend == "cpu" else "stored"


def measure_profile(
    node_id: str,
    boot_id: str,
    friendly_name: str,
    *,
    memory_limit: int | None,
    hosted_bytes: int,
    addrs: tuple[NetworkAddress, ...] = (),
    models: tuple[str, ...] = (),
    priority: int = 0,
    cpu_weights: str = "auto",
) -> NodeProfile:
    """Measure memory with psutil and build this node's ``NodeProfile``.

    ``hosted_bytes`` is the sum of ``share_bytes`` of the shards placed on this node.
    ``cpu_weights`` is the node's ``--cpu-weights`` (published as ``published_cpu_weights``).
    """
    backend = compute_backend()
    vm = psutil.virtual_memory()
    total, available = capped_memory(int(vm.total), int(vm.available), memory_limit, hosted_bytes)
    return NodeProfile(
        node_id=node_id,  # type: ignore[arg-type]
        boot_id=boot_id,
        friendly_name=friendly_name,
        memory_total=total,
        memory_available=available,
        cpu=platform.processor() or platform.machine(),
        cpu_count=os.cpu_count() or 0,
        os=f"{platform.system()} {platform.release()}",
        addrs=addrs,
        models=models,
        priority=priority,
        backend=backend,
        cpu_weights=published_cpu_weights(backend, cpu_weights),
    )


def profile_changed(old: NodeProfile | None, new: NodeProfile, *, memory_step: int = 256 * 1024 * 1024) -> bool:
    """Whether ``new`` differs enough from ``old`` to publish: any field other than
    available memory, or available memory moved by at least ``memory_step`` bytes (keeps the
    log from growing with every small fluctuation)."""
    if old is None:
        return True
    import msgspec

    if msgspec.structs.replace(old, memory_available=None) != msgspec.structs.replace(new, memory_available=None):
        return True
    if (old.memory_available is None) != (new.memory_available is None):
        return True
    return abs((old.memory_available or 0) - (new.memory_available or 0)) >= memory_step


def publish_due(old: NodeProfile | None, new: NodeProfile, old_hosted_bytes: int | None, hosted_bytes: int,
                *, memory_step: int = 256 * 1024 * 1024) -> bool:
    """Whether the node's profile loop publishes ``new``: ``profile_changed``, or the bytes of
    the shards this node hosts moved since the last publish (``old_hosted_bytes``, None before
    the first). A placement or deletion changes what the node has promised, not a fluctuation:
    under ``--memory-limit`` its available memory (``capped_memory``) moves by exactly that, often
    less than ``memory_step`` — left unpublished, a profile re-published for another field while
    3 shards were hosted would keep refusing a placement after one of them was deleted (placement
    takes the smaller of reported and computed, master/placement/memory.py ``usable_memory``)."""
    return profile_changed(old, new, memory_step=memory_step) or old_hosted_bytes != hosted_bytes
