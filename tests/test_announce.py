"""What a node says at start and while alone (``exo_p2p.node.announce``, ``exo_p2p.logs.configure.announce``):
which cluster it joined or started, the instances from before its restart being re-placed,
the open-cluster note once, and the no-peers warning after a peer left. Pure rules, no process."""

from __future__ import annotations

import io
import json

import pytest

from exo_p2p.logs import configure as node_logging
from exo_p2p.node.announce import (
    banner,
    from_before_fact,
    instances_from_before,
    membership_fact,
    no_peers_warning,
    secret_fact,
    still_coming,
)
from exo_p2p.types import Instance, NodeProfile, RunnerReady, ShardMetadata, State
from exo_p2p.types.state import RunnerRecord

A, B, C = "12D3KooWAAAAAAAAAAAAAAAAAAAA", "12D3KooWBBBBBBBBBBBBBBBBBBBB", "12D3KooWCCCCCCCCCCCCCCCCCCCC"


def _state(**kw) -> State:
    nodes = {n: NodeProfile(node_id=n, boot_id="now", friendly_name=name) for n, name in ((A, "a"), (B, "b"))}
    return State(nodes=nodes, **kw)


def _instance(instance_id: str, nodes=(A, B), boot="before", model="tiny", **kw) -> Instance:
    shards = tuple(
        ShardMetadata(node_id=n, runner_id=f"{instance_id}-r{rank}", rank=rank, world_size=len(nodes), start_layer=rank,
                      end_layer=rank + 1, n_layers=len(nodes), share_bytes=1, boot_id=boot)
        for rank, n in enumerate(nodes)
    )  # fmt: skip
    return Instance(instance_id=instance_id, model_id=model, sharding="pipeline", shards=shards, **kw)


# -- which cluster --------------------------------------------------------------------------------


def test_a_node_with_peers_says_it_joined_the_cluster_naming_its_master():
    fact = membership_fact("default", B, A, {A, B}, _state())
    assert fact.text == "joined cluster default: 2 nodes, master a"
    assert fact.fields["joined"] is True and fact.fields["master"] == A and fact.fields["detail"] == fact.text


def test_a_node_alone_says_it_started_a_new_cluster():
    fact = membership_fact("lab", A, A, {A}, _state())
    assert fact.text == "started a new cluster lab" and fact.fields["joined"] is False


def test_a_master_with_peers_says_it_is_the_master_and_unknown_names_are_short_ids():
    assert membership_fact("default", A, A, {A, B, C}, _state()).text == "joined cluster default: 3 nodes, master a (this node)"
    assert membership_fact("x", B, C, {B, C}, _state()).text == f"joined cluster x: 2 nodes, master {C[:12]}"


def test_no_master_yet_is_a_warning():
    fact = membership_fact("default", A, None, {A}, _state())
    assert fact.level == "warning" and "no master yet" in fact.text


# -- instances from before ------------------------------------------------------------------------


def test_instances_from_before_are_those_with_a_rank_on_an_earlier_boot_of_this_node():
    state = _state(instances={
        "i1": _instance("i1"),  # on A and B, placed on A's previous boot
        "i2": _instance("i2", nodes=(B,)),  # not on A: not A's to report
        "i3": _instance("i3", boot="now"),  # placed on this boot
        "i4": _instance("i4", failed_reason="x", gave_up=True),  # given up: not re-placed
    })  # fmt: skip
    assert [i.instance_id for i in instances_from_before(state, A, "now")] == ["i1"]


def test_still_coming_follows_re_placements_until_one_serves():
    old = _instance("i1")
    # the failed instance itself, not given up yet: coming
    assert still_coming(_state(instances={"i1": old}), [old]) == (old,)
    # re-placed, the re-placement loading: coming, as the re-placement
    new = _instance("i3", nodes=(A,), replaces="i1", boot="now")
    assert still_coming(_state(instances={"i3": new}), [old]) == (new,)
    # the re-placement serves: nothing to say
    runners = {s.runner_id: RunnerRecord(s.runner_id, "i3", s.node_id, RunnerReady()) for s in new.shards}
    assert still_coming(_state(instances={"i3": new}, runners=runners), [old]) == ()
    # deleted (`exo-p2p stop`) or given up: nothing either
    assert still_coming(_state(), [old]) == ()
    gave_up = _instance("i1", failed_reason="x", gave_up=True)
    assert still_coming(_state(instances={"i1": gave_up}), [old]) == ()


def test_the_from_before_line_names_model_nodes_and_how_to_drop_it():
    state = _state()
    fact = from_before_fact(state, [_instance("i1")])
    assert fact.text == "re-placing 1 instance from before: tiny on a, b; `exo-p2p stop tiny` to drop it"
    assert fact.fields["instances"] == ["i1"] and fact.fields["detail"] == fact.text
    two = from_before_fact(state, [_instance("i1"), _instance("i2", nodes=(A,), model="other")])
    assert two.text == "re-placing 2 instances from before: tiny on a, b; other on a; `exo-p2p stop MODEL` to drop one"
    assert from_before_fact(state, []) is None


# -- printed once ---------------------------------------------------------------------------------


@pytest.fixture
def log_to(monkeypatch):
    """``exo_p2p.logs.configure``'s stream and format set for one test (restored after)."""

    def use(fmt: str) -> io.StringIO:
        stream = io.StringIO()
        monkeypatch.setattr(node_logging, "_stream", stream)
        monkeypatch.setattr(node_logging, "_format", fmt)
        return stream

    return use


NOTICE = "the cluster is open: anyone may join"


def test_the_console_banner_says_each_fact_once(log_to):
    stream = log_to("console")
    facts = [membership_fact("default", B, A, {A, B}, _state()), from_before_fact(_state(), [_instance("i1")]), secret_fact(NOTICE)]
    node_logging.announce(banner(B, "http://127.0.0.1:52415", ["/ip4/127.0.0.1/tcp/1"], facts), facts)
    out = stream.getvalue()
    assert out.startswith(f"exo-p2p node {B} ready\n  api: http://127.0.0.1:52415\n  addr: /ip4/127.0.0.1/tcp/1\n")
    assert "  joined cluster default: 2 nodes, master a\n" in out and "  re-placing 1 instance from before" in out
    assert out.count(NOTICE) == 1 and f"  note: {NOTICE}" in out


def test_with_json_each_fact_is_one_record_and_there_is_no_banner(log_to, monkeypatch):
    import structlog

    records: list[tuple[str, str, dict]] = []

    class Capture:
        def __getattr__(self, level):
            return lambda event, **fields: records.append((level, event, fields))

    monkeypatch.setattr(structlog, "get_logger", lambda *_a: Capture())
    stream = log_to("json")
    facts = [membership_fact("default", A, A, {A}, _state()), secret_fact(NOTICE)]
    node_logging.announce(banner(A, "http://x", [], facts), facts)
    assert stream.getvalue() == ""
    assert [(lvl, ev) for lvl, ev, _ in records] == [("info", "cluster membership"), ("warning", "open cluster")]
    assert records[0][2]["detail"] == "started a new cluster default" and records[1][2] == {"notice": NOTICE}
    json.dumps([r[2] for r in records])  # the fields are JSON values
    closed = secret_fact(None)
    assert closed.event == "closed cluster" and closed.text == "cluster: closed (members share a cluster secret)"


# -- alone ----------------------------------------------------------------------------------------


def test_no_peers_warning_says_the_last_peer_left_once_one_had():
    assert no_peers_warning(None, True, 10.0) is None
    assert no_peers_warning(9.9, False, 10.0) is None
    assert no_peers_warning(12.4, False, 10.0) == "no peers found for 12 s: this node is a cluster of one"
    assert no_peers_warning(127.2, True, 10.0) == "no peers: the last peer left 127 s ago; this node is a cluster of one"
