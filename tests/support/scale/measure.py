"""The scale figures, each taken on a running ``ScaleCluster`` (docs/cluster.md, "Many
machines"). Times are trio-clock seconds: under ``trio.testing.MockClock(autojump_threshold=0)``
that is protocol time (timers, settle waits, latencies; CPU takes no time), and CPU is
measured apart, per member, with ``cpu.CpuMeter``.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass

import msgspec
import trio

from exo_p2p.types import ModelCard, NodeProfileUpdated, State
from master.placement.place import place_instance

from .cluster import GIB, ScaleCluster, SimNode
from .cpu import CpuMeter


@dataclass
class RestTraffic:
    """Per node per second at rest: messages and bytes (sent + received), the mean over the
    followers and the master's."""

    msgs_follower: float
    bytes_follower: float
    msgs_master: float
    bytes_master: float


def master_node(cluster: ScaleCluster) -> SimNode:
    """The member every live member follows; ``RuntimeError`` when there is none."""
    master = cluster.master_of_all()
    if master is None:
        raise RuntimeError("no single master")
    return cluster.nodes[master]


async def at_rest(cluster: ScaleCluster, seconds: float = 10.0) -> RestTraffic:
    """Traffic over ``seconds`` with nothing happening but heartbeats and the mesh's checks."""
    fabric, master = cluster.fabric, master_node(cluster).node_id
    before = {k: v.total() for k, v in fabric.traffic.items()}
    await trio.sleep(seconds)
    rates = {}
    for node in cluster.live():
        msgs, data = fabric.traffic[node.node_id].total()
        m0, b0 = before[node.node_id]
        rates[node.node_id] = ((msgs - m0) / seconds, (data - b0) / seconds)
    followers = [r for k, r in rates.items() if k != master] or [rates[master]]
    return RestTraffic(statistics.fmean(r[0] for r in followers), statistics.fmean(r[1] for r in followers),
                       *rates[master])


def state_size(cluster: ScaleCluster) -> int:
    """Bytes of the master's State as msgpack (what a snapshot carries)."""
    return len(msgspec.msgpack.encode(master_node(cluster).state))


def placement_ms(state: State, card: ModelCard, ranks: int, repeat: int = 3) -> float:
    """Median CPU ms of one ``place_instance`` of ``card`` on ``ranks`` nodes or more (process
    CPU time: on a shared machine, wall time counts the other processes' turns too)."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        inst = place_instance(state, card, min_nodes=ranks)
        times.append((time.process_time() - start) * 1000)
        if len(inst.shards) < ranks:
            raise RuntimeError(f"placement gave {len(inst.shards)} ranks, asked at least {ranks}")
    return statistics.median(times)


def profile_event(node: SimNode, i: int) -> NodeProfileUpdated:
    """The master's profile with another available memory: the event a busy node's profile
    makes (``exo_p2p.node.profile_publisher``)."""
    profile = node.state.nodes[node.node_id]  # type: ignore[index]
    return NodeProfileUpdated(msgspec.structs.replace(profile, memory_available=8 * GIB + (i % 1024) * (1 << 20)))


@dataclass
class Sequencing:
    """CPU per event: the master's (``events_per_s`` = 1 / that), a follower's mean, the fabric's
    per delivered copy; ``events`` sequenced."""

    events: int
    events_per_s: float
    follower_us: float
    fabric_us: float


async def sequencing(cluster: ScaleCluster, meter: CpuMeter, events: int = 1000) -> Sequencing:
    """Sequence ``events`` one by one (as commands do) and wait until every live member applied
    them; CPU charged to the master (its tasks and this one's ``emit`` calls) per event."""
    node = master_node(cluster)
    assert node.seat.role is not None
    gc.collect()
    gc.freeze()  # N members' objects in one process: a full collection is the harness's cost, not the master's
    meter.own(trio.lowlevel.current_task(), node.node_id)
    meter.reset()
    last = 0
    for i in range(events):
        last = await node.seat.role.emit([profile_event(node, i)])
        if i % 64 == 63:
            await trio.sleep(0)
    await cluster.wait_for(lambda: all(n.replica.last_idx >= last for n in cluster.live()), 600)
    seconds = dict(meter.seconds)
    meter.roots.pop(trio.lowlevel.current_task(), None)
    followers = [seconds.get(n.node_id, 0.0) for n in cluster.live() if n is not node]
    copies = events * max(1, len(followers))
    follower = statistics.fmean(followers) if followers else 0.0
    return Sequencing(events, events / max(seconds.get(node.node_id, 0.0), 1e-9), follower / events * 1e6,
                      seconds.get("fabric", 0.0) / copies * 1e6)


async def replication_lag(cluster: ScaleCluster, rate: float = 100.0, seconds: float = 3.0) -> tuple[float, float, int]:
    """(p50, p99) seconds from the master's ``emit`` to a follower's apply, over every follower
    and event, at ``rate`` events/s for ``seconds``; and the number of samples."""
    node = master_node(cluster)
    assert node.seat.role is not None
    emitted: dict[int, float] = {}
    applied: list[tuple[int, float]] = []

    def listen(e, _s) -> None:  # type: ignore[no-untyped-def]
        applied.append((e.idx, trio.current_time()))

    followers = [n for n in cluster.live() if n is not node]
    for f in followers:
        f.replica.listeners.append(listen)
    start, count = trio.current_time(), int(rate * seconds)
    for i in range(count):
        await trio.sleep_until(start + i / rate)
        at = trio.current_time()
        emitted[await node.seat.role.emit([profile_event(node, i)])] = at
    last = max(emitted)
    await cluster.wait_for(lambda: all(f.replica.last_idx >= last for f in followers), 60)
    for f in followers:
        f.replica.listeners.remove(listen)
    lags = sorted(t - emitted[idx] for idx, t in applied if idx in emitted)
    if not lags:
        raise RuntimeError("no follower applied an event")
    return percentile(lags, 50), percentile(lags, 99), len(lags)


def percentile(sorted_values: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of an ascending, non-empty list."""
    rank = max(1, min(len(sorted_values), round(p / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


async def failover(cluster: ScaleCluster, timeout: float = 60.0) -> tuple[float, str]:
    """Kill the master; seconds until every live member follows one new master that sequences
    (its ``MasterElected`` applied by all), and that master."""
    old = master_node(cluster).node_id
    cluster.kill(old)

    def elected() -> bool:
        new = cluster.master_of_all()
        if new in (None, old):
            return False
        term = cluster.nodes[new].member.term  # type: ignore[index]
        return all(n.state.term == term for n in cluster.live())

    seconds = await cluster.wait_for(elected, timeout, poll=0.01)
    return seconds, cluster.master_of_all()  # type: ignore[return-value]
