"""What a node says about itself (exo_p2p.node.status): its warnings in order, its counters with
a later part winning, and when it has joined the cluster (its API waits for that)."""

from __future__ import annotations

from exo_p2p.node.status import health_counters, health_warnings, joined
from exo_p2p.types import NodeProfile, State
from tests.support.rules.strategies import CARD


def test_warnings_name_a_duplicate_identity_no_master_and_each_unreachable_bootstrap_peer():
    warnings = health_warnings(alone_for=None, peer_left=False, duplicate_identity="another node uses this identity",
                               master=None, bootstrap_failures={"/ip4/10.0.0.2/tcp/1": "refused", "/ip4/10.0.0.1/tcp/1": "timeout"})
    assert warnings == ["another node uses this identity", "no master elected yet",
                        "bootstrap peer unreachable: /ip4/10.0.0.1/tcp/1: timeout",
                        "bootstrap peer unreachable: /ip4/10.0.0.2/tcp/1: refused"]
    assert health_warnings(alone_for=None, peer_left=False, duplicate_identity=None, master="m", bootstrap_failures={}) == []


def test_counters_of_a_later_part_win():
    assert health_counters({"a": 1, "b": 1}, {"b": 2}, {"c": 3}) == {"a": 1, "b": 2, "c": 3}


def test_joined_needs_a_master_this_boots_profile_and_every_listed_model():
    profile = NodeProfile(node_id="n1", boot_id="boot-2", friendly_name="n1")  # type: ignore[arg-type]
    state = State(nodes={"n1": profile}, model_cards={CARD.model_id: CARD})  # type: ignore[dict-item]
    assert joined(state, "n1", "boot-2", "master", [CARD])
    assert not joined(state, "n1", "boot-2", None, [CARD])
    assert not joined(state, "n1", "boot-3", "master", [CARD])  # the profile of an earlier boot
    assert not joined(State(nodes={"n1": profile}), "n1", "boot-2", "master", [CARD])  # type: ignore[dict-item]
    assert not joined(State(), "n1", "boot-2", "master", [])
