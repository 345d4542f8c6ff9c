"""N real cluster members in one trio run over the in-memory ``Fabric`` (docs/cluster.md,
"Many machines").

Each member is what ``exo_p2p.node`` builds, minus libp2p and the worker: a ``Replica`` on
disk (``sync=False``: no fsync, the harness measures the protocol, not the disk), a
``ClusterMember`` (election, heartbeats, log replication, mesh) and a ``MasterSeat`` (the real
``master.role.MasterRole``: sequencing, State apply, placement). At start a member announces
itself as ``ProfilePublisher`` would (``NodeProfileUpdated`` and ``NodeModelsUpdated`` with
the model card every node holds). The fabric connects every pair of live members when they
start (mDNS on a LAN finds every node); the mesh keeper re-dials and announces edges itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import trio

from exo_p2p.cluster.member import ClusterMember, ClusterSettings
from exo_p2p.config import NodeConfig
from exo_p2p.node.seat import MasterSeat
from exo_p2p.replica import Replica
from exo_p2p.types import ModelCard, NetworkAddress, NodeModelsUpdated, NodeProfile, NodeProfileUpdated, State

from .cpu import CpuMeter
from .memnet import Fabric, MemoryNet

GIB = 1 << 30
NODE_MEMORY = 16 * GIB


def node_ids(n: int) -> list[str]:
    """``n`` node ids as long as libp2p's (52 characters, so message sizes are true), sorting
    in index order: ``12D3KooW`` + the index in 44 digits."""
    return [f"12D3KooW{i:044d}" for i in range(n)]


def boot_id(node_id: str) -> str:
    """A boot id of a uuid's length (36 characters), fixed per node."""
    digits = node_id[-12:]
    return f"00000000-0000-4000-8000-{digits}"


def scale_card(n_layers: int = 32, total: int = 4 * GIB) -> ModelCard:
    """A synthetic ``n_layers``-layer card of ``total`` bytes every member holds (placement's input)."""
    layer = total // (n_layers + 2)
    return ModelCard(
        model_id="scale-model", n_layers=n_layers, hidden_size=2048, num_attention_heads=16, num_key_value_heads=4,
        vocab_size=32000, context_length=4096, storage_size=layer * (n_layers + 2), layer_bytes=(layer,) * n_layers,
        embedding_bytes=layer, head_bytes=layer, norm_bytes=0, tie_word_embeddings=False,
    )


@dataclass
class SimNode:
    """One member: its net, replica, seat and member, and the scope that kills it."""

    node_id: str
    net: MemoryNet
    replica: Replica
    seat: MasterSeat
    member: ClusterMember
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    alive: bool = True

    @property
    def state(self) -> State:
        return self.replica.state


class ScaleCluster:
    """``n`` members under ``root`` (one data dir each) on ``fabric``; ``meter``
    (optional) is told which tasks are whose. ``start`` them in a
    nursery; ``kill`` one; ``master_of_all`` says whether the live ones formed one cluster."""

    def __init__(self, n: int, root: Path, fabric: Fabric, *, card: ModelCard | None = None,
                 settings: ClusterSettings | None = None, meter: CpuMeter | None = None) -> None:
        if n < 1:
            raise ValueError(f"a cluster has at least one member, got {n}")
        self.fabric, self.card, self.meter = fabric, card or scale_card(), meter
        self.nodes: dict[str, SimNode] = {}
        for i, node_id in enumerate(node_ids(n)):
            net = fabric.add(node_id, f"10.{i // 250}.{i % 250 + 1}.1")
            data = root / node_id
            data.mkdir(parents=True, exist_ok=True)
            replica = Replica(data / "events.log", sync=False)
            seat = MasterSeat(node_id, replica, NodeConfig(data_dir=data, mdns=False))
            member = ClusterMember(net, replica, node_id, boot_id(node_id), seat.hooks,
                                   settings=settings or ClusterSettings(), clock=trio.current_time)
            self.nodes[node_id] = SimNode(node_id, net, replica, seat, member)

    def live(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.alive]

    async def start(self, nursery: trio.Nursery) -> None:
        """Start every member (in id order), then connect every pair (discovery)."""
        self.fabric.nursery = nursery
        for node in self.nodes.values():
            await nursery.start(self._run, node)
        ids = list(self.nodes)
        for i, a in enumerate(ids):
            for b in ids[i + 1:]:
                self.fabric.connect(a, b)

    async def _run(self, node: SimNode, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self.meter is not None:
            self.meter.own(trio.lowlevel.current_task(), node.node_id)
        with node.scope:
            async with trio.open_nursery() as nursery:
                node.seat.bind(node.member, nursery)
                await nursery.start(node.member.run)
                profile = NodeProfile(node.node_id, boot_id(node.node_id), f"mac-{node.node_id[-3:]}",  # type: ignore[arg-type]
                                      memory_total=NODE_MEMORY, memory_available=NODE_MEMORY,
                                      addrs=(NetworkAddress(node.net.listen_addrs()[0], node.net.ip, "en0", "ethernet"),),  # type: ignore[arg-type]
                                      models=(self.card.model_id,))
                node.member.send_local(NodeProfileUpdated(profile))
                node.member.send_local(NodeModelsUpdated(node.node_id, (self.card,)))  # type: ignore[arg-type]
                task_status.started()

    def kill(self, node_id: str) -> None:
        """The member dies at once (its tasks end, its connections close)."""
        node = self.nodes[node_id]
        node.alive = False
        node.scope.cancel()
        self.fabric.kill(node_id)

    def master_of_all(self) -> str | None:
        """The master every live member follows, when there is one and it sequences."""
        masters = {n.member.master for n in self.live()}
        if len(masters) != 1:
            return None
        master = masters.pop()
        node = self.nodes.get(master) if master is not None else None
        return master if node is not None and node.alive and node.member.is_master else None

    def formed(self) -> bool:
        """One cluster: every live member follows one master and lists every live member."""
        live = {n.node_id for n in self.live()}
        return self.master_of_all() is not None and all(live <= set(n.state.nodes) for n in self.live())

    def meshed(self) -> bool:
        """Every live member's State holds an edge between every ordered pair of live members."""
        live = {n.node_id for n in self.live()}
        want = len(live) * (len(live) - 1)
        for node in self.live():
            edges = node.state.edges
            if sum(len(live.intersection(edges.get(a, {}))) for a in live) != want:  # type: ignore[call-overload]
                return False
        return True

    async def wait_for(self, check, timeout: float, poll: float = 0.05) -> float:  # type: ignore[no-untyped-def]
        """Seconds (trio clock) until ``check()`` holds; ``TimeoutError`` after ``timeout``."""
        start = trio.current_time()
        with trio.move_on_after(timeout):
            while not check():
                await trio.sleep(poll)
            return trio.current_time() - start
        raise TimeoutError(f"{getattr(check, '__name__', check)} not reached within {timeout} s")
