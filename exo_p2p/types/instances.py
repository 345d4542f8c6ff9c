"""Placed models: instances and their shards (docs/architecture.md#vocabulary "instance", "shard")."""

from __future__ import annotations

from typing import Literal

import msgspec

from exo_p2p.types.common import Bytes, InstanceId, ModelId, NodeId, RunnerId

Sharding = Literal["pipeline", "tensor"]
InstanceStatus = Literal["loading", "ready", "failed"]


class ShardMetadata(msgspec.Struct, frozen=True):
    """One rank's part of an instance.

    Pipeline: layers ``[start_layer, end_layer)``; tensor: all layers, ``1/world_size`` of
    each (``start_layer=0, end_layer=n_layers``). ``share_bytes`` is what placement computed
    this rank loads (layers + non-layer tensors). ``boot_id`` is the node's boot id at
    placement time: a node restarted since never runs this shard (docs/architecture.md#instance-lifecycle).
    ``ring_address`` is ``ip:port`` where this rank listens for its ring neighbours (empty
    for single-rank instances). ``weights_dtype`` is what its runner holds, decided by
    placement: ``"stored"`` (as on disk, quantized or not) or ``"float32"`` (expanded at load,
    a CPU node); ``share_bytes`` is in those bytes, i.e. what the runner of this shard holds.
    """

    node_id: NodeId
    runner_id: RunnerId
    rank: int
    world_size: int
    start_layer: int
    end_layer: int
    n_layers: int
    share_bytes: Bytes
    boot_id: str
    ring_address: str = ""
    weights_dtype: str = "stored"


class RankSettings(msgspec.Struct, frozen=True):
    """Settings every rank of an instance must share, fixed once when the instance is placed
    (from the placing master's node settings) so ranks on nodes started with other values
    still agree: ranks that prefill in chunks of different sizes meet at different collective
    points and deadlock. ``prefill_chunk_size``: prompt tokens per prefill step (tokens).
    ``max_batch``: sequences a runner decodes together in one forward pass (1: one request at
    a time; every rank must run the same batch, see ``worker.engine.scheduler``).
    ``kv_cache_bits``: the KV cache's bits (0: full precision; 8 or 4: quantized,
    ``worker/engine/kvq``): fixed per instance so every rank holds, counts and restores its
    KV alike, and the master's admission counts the bytes the ranks hold."""

    prefill_chunk_size: int
    max_batch: int = 1
    kv_cache_bits: int = 0


class PlacedNode(msgspec.Struct, frozen=True):
    """A node of the placement a shrunk instance stands in for (``Instance.placed``):
    its id and its friendly name when the instance was re-placed smaller (``""``: unknown),
    kept because a node that left is no longer in State to be named from; and the shard it
    held: layers ``[start_layer, end_layer)``, ``share_bytes``, ``weights_dtype`` (``end_layer``
    0: not recorded), so the restore can give each node its layers back
    (``master.placement.keep_layers``)."""

    node_id: NodeId
    name: str = ""
    start_layer: int = 0
    end_layer: int = 0
    share_bytes: int = 0
    weights_dtype: str = ""


class Instance(msgspec.Struct, frozen=True):
    """A model placed on a cycle of nodes, ``shards`` in rank order.

    ``settings``: what every rank uses whatever its node was started with (None: placed by a
    master that did not fix them; each runner then uses its node's own values)."""

    instance_id: InstanceId
    model_id: ModelId
    sharding: Sharding
    shards: tuple[ShardMetadata, ...]
    failed_reason: str | None = None
    replaces: InstanceId | None = None
    attempt: int = 0
    gave_up: bool = False
    """The master will not re-place this failed instance (attempts used up, or nothing fits)."""
    served: bool = False
    """Every rank reached Ready at least once (set by ``apply``): a failure after that starts
    the count of re-placement attempts again — the limit is for crash loops, not for a
    long-lived instance that outlives several node restarts."""
    settings: RankSettings | None = None
    placed: tuple[PlacedNode, ...] = ()
    """The nodes, in rank order, of the placement this instance stands in for when it was
    re-placed on fewer ranks after a failure (a shrunk instance, ``master.replace``); ``()``
    when it runs at its placed size. The master brings it back to that size (``master.restore``)."""
    restores: bool = False
    """This instance stands in for ``replaces`` (still serving): a shrunk instance brought back
    to its placed size, or one moved to a cheaper ring (``moved``); the master deletes that
    one once this one is ready and it has no task in flight (``master.restore``)."""
    moved: str = ""
    """Why this instance was placed beside ``replaces`` (still serving) when that one was moved
    to a cheaper ring (``master.relink``; ``""``: not a move). It also has ``restores`` set: the
    switch is ``master.restore``'s."""
    model_digest: str = ""
    """The manifest digest of the placed model (docs/models.md): what a rank whose node lacks the
    model fetches from the nodes holding it (``""``: placed by a master before manifests)."""

    @property
    def world_size(self) -> int:
        return len(self.shards)

    @property
    def placed_ranks(self) -> int:
        """Ranks of the placement this instance stands in for (``world_size`` unless shrunk)."""
        return max(len(self.placed), self.world_size)

    @property
    def shrunk(self) -> bool:
        """Whether it runs on fewer ranks than it was placed with (``placed``)."""
        return len(self.placed) > self.world_size

    def left_nodes(self) -> tuple[PlacedNode, ...]:
        """The nodes of ``placed`` it no longer has a rank on, in rank order."""
        here = {s.node_id for s in self.shards}
        return tuple(p for p in self.placed if p.node_id not in here)

    def shard_for(self, node_id: str) -> ShardMetadata | None:
        """This node's shard, or None when the node holds no rank of this instance."""
        for shard in self.shards:
            if shard.node_id == node_id:
                return shard
        return None


class InstanceUsage(msgspec.Struct, frozen=True):
    """When an instance was last used and how long it is kept once idle (``State.usage``;
    docs/models.md "Placement on demand and idle unload").

    ``last_used``: unix seconds (the master's wall clock) of the last request that started or
    ended on it; ``keep_alive``: seconds it stays loaded after ``last_used`` once no request
    runs on it (``0``: unloaded as soon as it is idle), None: forever; ``pinned``: never
    unloaded to make room for another model (``place --pin``); ``on_demand``: placed by a
    request rather than by hand; ``served``: see below. An instance with no entry is kept forever and never unloaded.
    """

    last_used: float
    keep_alive: float | None = None
    pinned: bool = False
    on_demand: bool = False
    served: bool = False
    """A request ran on it: until then it is kept at least ``master.idle.READY_GRACE`` after it
    is ready, so the request that placed it is served before it can expire."""

    @property
    def expires_at(self) -> float | None:
        """Unix seconds after which the idle instance is unloaded; None: never."""
        return None if self.keep_alive is None or self.pinned else self.last_used + self.keep_alive
