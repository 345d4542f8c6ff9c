"""The control-plane scale harness at small N (docs/cluster.md, "Many machines"): eight real
cluster members over the in-memory transport form one cluster, replicate, place and elect
again after the master dies. Protocol time runs on trio's MockClock (autojump), so the
bounds are the product's own timeouts, not the machine's speed. Big N: scripts/bench_scale.py."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from exo_p2p import defaults
from exo_p2p.cluster.messages import PROTOCOL_VERSION
from exo_p2p.types import PlaceInstance, new_id
from tests.support.scale.cluster import ScaleCluster
from tests.support.scale.cpu import CpuMeter
from tests.support.scale.measure import at_rest, failover, master_node, placement_ms, replication_lag, sequencing
from tests.support.scale.memnet import Fabric

N = 8
FORM_BOUND = defaults.KNOWN_SETTLE + 2 * defaults.PEER_TIMEOUT
"""Cold start to one cluster: a start settle, an election, profiles sequenced (generous)."""
FAILOVER_BOUND = defaults.PEER_TIMEOUT + defaults.FAILOVER_SETTLE + 2 * defaults.HEARTBEAT_INTERVAL
"""A dead master is gone within one peer timeout (sooner: its connections close), then settle and claim."""


def run(main, *args):  # type: ignore[no-untyped-def]
    return trio.run(main, *args, clock=trio.testing.MockClock(autojump_threshold=0))


async def _cluster_life(tmp_path, loss: float) -> dict:  # type: ignore[no-untyped-def]
    out: dict = {}
    meter = CpuMeter()
    trio.lowlevel.add_instrument(meter)
    cluster = ScaleCluster(N, tmp_path, Fabric(latency=0.002, jitter=0.001, loss=loss, seed=7), meter=meter)
    async with trio.open_nursery() as nursery:
        await cluster.start(nursery)
        out["formed"] = await cluster.wait_for(cluster.formed, FORM_BOUND)
        out["meshed"] = await cluster.wait_for(cluster.meshed, FORM_BOUND)
        follower = next(n for n in cluster.live() if not n.member.is_master)
        result = await follower.member.command(PlaceInstance(new_id(), "scale-model", min_nodes=2))
        out["placed"] = result
        await cluster.wait_for(lambda: all(n.state.instances for n in cluster.live()), 5)
        out["instances"] = {n.node_id: dict(n.state.instances) for n in cluster.live()}
        out["rest"] = await at_rest(cluster, 5.0)
        out["seq"] = await sequencing(cluster, meter, 200)
        out["lag"] = await replication_lag(cluster, 100.0, 1.0)
        out["hashes"] = {n.replica.hash() for n in cluster.live()}
        out["placement_ms"] = placement_ms(master_node(cluster).state, cluster.card, 4, repeat=1)
        out["old_master"] = master_node(cluster).node_id
        out["failover"] = await failover(cluster, FAILOVER_BOUND)
        nursery.cancel_scope.cancel()
    return out


@pytest.mark.timeout(60)
def test_eight_members_form_replicate_place_and_fail_over(tmp_path):
    out = run(_cluster_life, tmp_path, 0.0)
    assert out["formed"] <= FORM_BOUND and out["meshed"] <= FORM_BOUND
    assert out["placed"].error is None, out["placed"].error
    placed = list(out["instances"].values())
    assert all(p == placed[0] for p in placed) and len(placed[0]) == 1  # one instance, the same everywhere
    (inst,) = placed[0].values()
    assert len(inst.shards) >= 2 and sum(s.end_layer - s.start_layer for s in inst.shards) == 32
    assert len(out["hashes"]) == 1  # every member applied the same log to the same State
    rest = out["rest"]
    assert 0 < rest.bytes_follower < 10_000 and rest.msgs_master >= rest.msgs_follower
    assert out["seq"].events == 200 and out["seq"].events_per_s > 0 and out["seq"].follower_us > 0
    p50, p99, samples = out["lag"]
    assert samples == 100 * (N - 1) and 0 < p50 <= p99 <= 1.0
    seconds, new_master = out["failover"]
    assert new_master != out["old_master"] and seconds <= FAILOVER_BOUND
    assert out["placement_ms"] > 0


@pytest.mark.timeout(60)
def test_members_converge_over_a_lossy_fabric(tmp_path):
    """5 % of gossip copies, requests and replies lost: gaps are fetched, commands retried,
    and every member still ends with one State."""
    out = run(_cluster_life, tmp_path, 0.05)
    assert out["placed"].error is None and len(out["hashes"]) == 1
    assert out["failover"][1] != out["old_master"]


def test_the_fabric_refuses_impossible_figures():
    with pytest.raises(ValueError):
        Fabric(loss=1.0)
    with pytest.raises(ValueError):
        Fabric(latency=0.001, jitter=0.002)
    assert PROTOCOL_VERSION >= 1


def test_only_a_few_followers_ack_each_applied_event():
    from exo_p2p.cluster.heartbeats import acks_commits
    live = [f"n{i:02d}" for i in range(10)]
    ackers = [n for n in live if acks_commits(n, "n00", live, 3)]
    assert ackers == ["n01", "n02", "n03"]  # the master is never counted, nor acks
    assert all(acks_commits(n, "n09", live[:4], 3) for n in live[:3])  # small cluster: every follower
    assert not acks_commits("n05", None, live, 3)  # no master, nothing to ack


def test_edges_announced_together_apply_as_one_and_are_bounded():
    from exo_p2p.state import apply
    from exo_p2p.types import IndexedEvent, State, TopologyEdge, TopologyEdgeCreated, TopologyEdgesCreated
    from exo_p2p.types.events import MAX_EDGES_PER_EVENT
    from master.local_rules import refuse_local

    one = apply(State(), IndexedEvent(term=1, idx=1, event=TopologyEdgeCreated(TopologyEdge("a", "b", "10.0.0.2"))))
    both = TopologyEdgesCreated((TopologyEdge("a", "c", "10.0.0.3"), TopologyEdge("a", "d", "10.0.0.4")))
    after = apply(one, IndexedEvent(term=1, idx=2, event=both))
    assert set(after.edges["a"]) == {"b", "c", "d"} and set(one.edges["a"]) == {"b"}  # the old State is untouched
    assert refuse_local(after, "a", both) is None
    assert refuse_local(after, "b", both) == "edge from another node"
    many = TopologyEdgesCreated(tuple(TopologyEdge("a", f"n{i}", "10.0.0.9") for i in range(MAX_EDGES_PER_EVENT + 1)))
    assert "more than" in (refuse_local(after, "a", many) or "")
