"""This node's profile (memory, addresses, models, priority), measured every 2 s and
published as ``NodeProfileUpdated`` when it changed enough (the measure and the rule are the
worker's, ``worker.profile``, injected by the node: this module imports no role)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import msgspec
import structlog
import trio

from exo_p2p.limits import check_nofile
from exo_p2p.listen.accept import Backoff
from exo_p2p.types import Event, ModelCard, NetworkAddress, NodeModelsUpdated, NodeProfile, NodeProfileUpdated, State

log = structlog.get_logger("exo_p2p.node")

PROFILE_INTERVAL = 2.0
"""Seconds between two measures of this node's profile."""


class Measure(Protocol):
    """``worker.profile.measure_profile`` with this node's settings bound: the profile of
    this node hosting shards of ``hosted_bytes``, listening on ``addrs``, holding ``models``."""

    def __call__(self, *, hosted_bytes: int, addrs: tuple[NetworkAddress, ...], models: tuple[str, ...]) -> NodeProfile: ...


PublishDue = Callable[[NodeProfile | None, NodeProfile, int | None, int], bool]
"""``worker.profile.publish_due(last published, measured, last hosted bytes, hosted bytes)``."""


def interface_type(ip: str) -> str:
    """Interface kind for an IPv4 address as far as the address alone tells."""
    return "loopback" if ip.startswith("127.") else "other"


def address_of(multiaddr: str) -> NetworkAddress:
    """The ``NetworkAddress`` of a listen multiaddr (``/ip4/IP/tcp/PORT``): its IP and the
    interface kind the IP tells; no interface name."""
    parts = multiaddr.split("/")
    ip = parts[2] if len(parts) > 2 else ""
    return NetworkAddress(multiaddr=multiaddr, ip=ip, interface="", interface_type=interface_type(ip))  # type: ignore[arg-type]


def with_fault_hooks(profile: NodeProfile, hooks: dict[str, str]) -> NodeProfile:
    """Tests only: ``free_memory=BYTES`` caps the memory this node reports available (its
    total is kept, so placement on a node without instances still sees the whole node)."""
    cap = hooks.get("free_memory", "")
    if not cap.isdigit() or profile.memory_available is None:
        return profile
    return msgspec.structs.replace(profile, memory_available=min(profile.memory_available, int(cap)))


class ProfilePublisher:
    """Publishes this node's profile through ``emit``. ``hosted_bytes`` reads the bytes of
    the shards the worker hosts, ``listen_addrs`` the host's listen multiaddrs, ``cards``
    the models this node's store lists, ``depot`` the models it holds and its free disk,
    ``member`` the cluster member (its master and its outbox)."""

    def __init__(self, node_id: str, boot_id: str, measure: Measure, publish_due: PublishDue, *,  # type: ignore[no-untyped-def]
                 hosted_bytes: Callable[[], int], listen_addrs: Callable[[], list[str]],
                 cards: Callable[[], list[ModelCard]], depot, member, state: Callable[[], State],
                 emit: Callable[[Event], None], fault_hooks: dict[str, str]) -> None:
        self.node_id, self.boot_id = node_id, boot_id
        self._measure, self._publish_due = measure, publish_due
        self._hosted_bytes, self._listen_addrs, self._cards = hosted_bytes, listen_addrs, cards
        self._depot, self._member, self._state, self._emit = depot, member, state, emit
        self._fault_hooks = fault_hooks

    async def run(self) -> None:
        """Measure and publish this node's profile every ``PROFILE_INTERVAL`` s; a transient
        OS error (out of descriptors reading ``/proc``) costs a round, not the node
        (``exo_p2p.listen.accept``); each round also keeps the open-file limit
        (``exo_p2p.limits.check_nofile``). Never returns."""
        pause = Backoff("profile")
        last: tuple = (None, None)
        while True:
            try:
                last = self.round(*last)
                check_nofile("profile")
            except OSError as exc:
                await pause.ride_out(exc)
                continue
            pause.reset()
            await trio.sleep(PROFILE_INTERVAL)

    def measure(self, hosted_bytes: int) -> NodeProfile:
        """This node's profile now, hosting shards of ``hosted_bytes``: measured, capped by the
        test-only fault hooks, with the models its depot holds and its free disk rounded down
        to whole GiB (other writers on the disk must not churn it). Raises ``OSError`` when
        ``/proc`` cannot be read."""
        profile = self._measure(hosted_bytes=hosted_bytes,
                                addrs=tuple(address_of(a) for a in self._listen_addrs()),
                                models=tuple(sorted(c.model_id for c in self._cards())))
        profile = with_fault_hooks(profile, self._fault_hooks)
        return msgspec.structs.replace(  # models travel between nodes (docs/models.md)
            profile, held_models=self._depot.held(), models_disk_free=self._depot.disk_free() >> 30 << 30)

    def round(self, last: NodeProfile | None, last_hosted: int | None) -> tuple[NodeProfile | None, int | None]:
        """One round of ``run``: returns the (profile, hosted bytes) last published."""
        hosted = self._hosted_bytes()
        profile = self.measure(hosted)
        published = self._state().nodes.get(self.node_id)  # type: ignore[call-overload]
        # also re-publish when State's copy differs from what we published (we were timed
        # out, our log was replaced by another master's) once nothing of ours is in flight
        member = self._member
        stale = last is not None and published != last and member.master is not None and member.outbox.idle
        if self._publish_due(last, profile, last_hosted, hosted) or stale:
            log.debug("profile published", boot_id=self.boot_id)
            self._emit(NodeProfileUpdated(profile))
            last, last_hosted = profile, hosted
        if published is not None and published.models != profile.models and member.outbox.idle:
            self._emit(NodeModelsUpdated(self.node_id, tuple(self._cards())))  # type: ignore[arg-type]
        return last, last_hosted
