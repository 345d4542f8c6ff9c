"""Nodes as the cluster sees them: profiles and reachability edges (docs/architecture.md#vocabulary)."""

from __future__ import annotations

from typing import Literal

import msgspec

from exo_p2p.types.common import Bytes, NodeId
from exo_p2p.types.manifest import HeldModel

InterfaceType = Literal["thunderbolt", "ethernet", "wifi", "loopback", "other"]

MAX_ADDRESSES = 8
"""Addresses of one sink a source keeps figures for (``State.links``, bounded by ``apply``;
the prober measures at most this many); more are ignored."""


class NetworkAddress(msgspec.Struct, frozen=True):
    """One dialable address of a node: a libp2p multiaddr, its IP, and the interface kind."""

    multiaddr: str
    ip: str
    interface: str = ""
    interface_type: InterfaceType = "other"


class NodeSpeed(msgspec.Struct, frozen=True):
    """A node's measured compute speed (``worker.calibrate``; docs/placement-speed.md), quantised
    (``worker.calibrate.run.quantise``) so a steady node publishes no new figure.

    ``decode_ns_per_kib``: nanoseconds one decode step (one token) spends per KiB of layer
    weights it reads (a tiny synthetic layer, one row); ``prefill_ns_per_kib``: the same per
    token of a 64-token prefill (matmul throughput at a model's shapes); ``mem_mib_per_s``:
    memory bandwidth (MiB/s, a large array summed). All positive and within
    ``master.placement.speed_split.SPEED_BOUNDS``, else dropped by the master."""

    decode_ns_per_kib: int
    prefill_ns_per_kib: int
    mem_mib_per_s: int


class NodeProfile(msgspec.Struct, frozen=True):
    """A node's self-description, published periodically and on change.

    ``memory_total``/``memory_available`` are bytes already capped by ``--memory-limit``
    (docs/architecture.md#rules); ``None`` means *not measured yet* and is never treated as 0 bytes.
    ``boot_id`` changes on every start of the node process: runners are tied to it.
    ``models`` lists the model ids this node holds (their cards are in ``State.model_cards``).
    ``backend`` is where its runners compute: ``"cpu"`` or ``"metal"`` (``""``: not said, as
    from nodes before it). ``cpu_weights`` is what a CPU node's runners hold (``--cpu-weights``):
    ``"auto"`` (float32 when the float32 share fits, else as stored), ``"float32"`` or
    ``"stored"``; a Metal node, and a profile from before the field, say ``"stored"``.
    Placement reads both (``master.placement.split.rank_weights``).
    ``held_models`` lists the manifests this node holds, complete or partial (docs/models.md,
    ``exo_p2p.models.depot.depot``); ``models_disk_free`` is the free bytes of its models dir (rounded down to whole GiB)
    (None: not said, as from nodes before it).
    """

    node_id: NodeId
    boot_id: str
    friendly_name: str
    memory_total: Bytes | None = None
    memory_available: Bytes | None = None
    cpu: str = ""
    cpu_count: int = 0
    os: str = ""
    addrs: tuple[NetworkAddress, ...] = ()
    models: tuple[str, ...] = ()
    priority: int = 0
    backend: str = ""
    cpu_weights: str = "stored"
    held_models: tuple[HeldModel, ...] = ()
    models_disk_free: Bytes | None = None
    max_loaded_models: int | None = None
    """Models this node keeps loaded at most (``--max-loaded-models``; None: no bound but
    memory); a placement beyond it unloads its idle instances first (``master.handover``)."""
    aliases: tuple[str, ...] = ()
    """``NAME=MODEL`` model aliases this node declares (``--alias``; at most 64 of at most 256
    characters, ``exo_p2p.api.demand.aliases``): every node's API resolves them."""
    speed: NodeSpeed | None = None
    """This node's measured speed (None: not measured yet, ``--calibrate off``, or from a node
    before it); placement splits pipeline layers by it (``master.placement.speed_split``)."""


MAX_ALIASES = 64
"""Model aliases one node declares at most (``NodeProfile.aliases``; docs/security.md)."""
MAX_ALIAS_CHARS = 256
"""Characters of one ``NAME=MODEL`` alias at most."""


class TopologyEdge(msgspec.Struct, frozen=True):
    """``source`` reached ``sink`` at ``address`` (an IP the sink listens on)."""

    source: NodeId
    sink: NodeId
    address: str
    interface_type: InterfaceType = "other"


class LinkFigures(msgspec.Struct, frozen=True, omit_defaults=True):
    """What ``source`` measured of one address of ``sink`` (one edge per (source, sink, address),
    ``State.links``; docs/links.md).

    ``address`` is the sink's IP; ``rtt_us`` the median round trip of small probes in
    microseconds; ``bytes_per_s`` the throughput of a bounded transfer in bytes per second
    (None: not measured yet). Both are quantised (``exo_p2p.links.figures.quantise``) and
    re-published only when they move by a stated fraction, so steady links add no events.
    ``interface_type`` is the sink's own word for the interface at that address.
    """

    address: str
    rtt_us: int
    bytes_per_s: int | None = None
    interface_type: InterfaceType = "other"
