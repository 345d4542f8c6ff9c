"""This node's profile publishing (exo_p2p.node.profile_publisher): addresses from listen
multiaddrs, the test-only memory cap, and a round that publishes on change and re-publishes
a profile State lost once nothing of the node's is in flight."""

from __future__ import annotations

from types import SimpleNamespace

from exo_p2p.node.profile_publisher import ProfilePublisher, address_of, with_fault_hooks
from exo_p2p.types import NodeProfile, NodeProfileUpdated, State


def test_address_of_a_listen_multiaddr():
    loop = address_of("/ip4/127.0.0.1/tcp/4001")
    assert (loop.ip, loop.interface_type) == ("127.0.0.1", "loopback")
    assert address_of("/ip4/10.1.2.3/tcp/4001").interface_type == "other"


def test_free_memory_hook_caps_available_memory_only():
    profile = NodeProfile(node_id="n", boot_id="b", friendly_name="n", memory_total=100, memory_available=80)  # type: ignore[arg-type]
    capped = with_fault_hooks(profile, {"free_memory": "30"})
    assert (capped.memory_total, capped.memory_available) == (100, 30)
    assert with_fault_hooks(profile, {}) is profile
    assert with_fault_hooks(profile, {"free_memory": "lots"}) is profile


def _publisher(state: State, emitted: list) -> ProfilePublisher:
    def measure(*, hosted_bytes, addrs, models):  # type: ignore[no-untyped-def]
        return NodeProfile(node_id="n", boot_id="b", friendly_name="n", memory_total=100, memory_available=50, addrs=addrs)  # type: ignore[arg-type]

    member = SimpleNamespace(master="m", outbox=SimpleNamespace(idle=True))
    depot = SimpleNamespace(held=lambda: (), disk_free=lambda: 5 << 30 | 123)
    return ProfilePublisher("n", "b", measure, lambda old, new, old_h, h: old != new, hosted_bytes=lambda: 0,
                            listen_addrs=lambda: ["/ip4/127.0.0.1/tcp/1"], cards=lambda: [], depot=depot,
                            member=member, state=lambda: state, emit=emitted.append, fault_hooks={})


def test_a_round_publishes_once_and_again_when_state_lost_it():
    emitted: list = []
    publisher = _publisher(State(), emitted)
    last = publisher.round(None, None)
    assert [type(e) for e in emitted] == [NodeProfileUpdated]
    assert last[0].models_disk_free == 5 << 30  # whole GiB
    publisher.round(*last)  # unchanged, and State differs from it (not applied yet): re-published
    assert len(emitted) == 2
    applied = _publisher(State(nodes={"n": last[0]}), emitted)  # type: ignore[dict-item]
    applied.round(*last)
    assert len(emitted) == 2
