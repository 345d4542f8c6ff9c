"""``place``'s replica check (``exo_p2p.cli.placement.replica_check``): an instance being re-placed counts
as existing, so a cluster restarted with its data dirs is not given a second instance
beside the one it re-places. Pure rules over the API's JSON, no process."""

from __future__ import annotations

from exo_p2p.cli.placement.replica_check import counted_instances, replica_notice, replacing

LISTED = [
    {"instance_id": "inst-ready", "model": "tiny", "status": "ready"},
    {"instance_id": "inst-loading", "model": "tiny", "status": "loading"},
    {"instance_id": "inst-coming", "model": "tiny", "status": "failed"},
    {"instance_id": "inst-gave-up", "model": "tiny", "status": "failed"},
    {"instance_id": "inst-other", "model": "other", "status": "ready"},
]
IN_STATE = {"inst-coming": {"gave_up": False}, "inst-gave-up": {"gave_up": True}}


def _ids(instances) -> list[str]:
    return [i["instance_id"] for i in instances]


def test_a_failed_instance_the_master_re_places_counts_and_a_given_up_one_does_not():
    assert _ids(counted_instances("tiny", LISTED, IN_STATE)) == ["inst-ready", "inst-loading", "inst-coming"]
    assert _ids(counted_instances("other", LISTED, IN_STATE)) == ["inst-other"]
    assert counted_instances("absent", LISTED, IN_STATE) == []


def test_a_failed_instance_state_does_not_list_is_not_counted():
    only_failed = [LISTED[2]]
    assert counted_instances("tiny", only_failed, {}) == []
    assert counted_instances("tiny", only_failed, {"inst-coming": {}}) == only_failed  # no gave_up field: not given up
    assert replacing(LISTED[2], IN_STATE) and not replacing(LISTED[0], IN_STATE) and not replacing(LISTED[3], IN_STATE)


def test_the_notice_says_which_instances_are_being_re_placed():
    short = {"inst-ready": "r", "inst-coming": "c"}
    one = replica_notice("tiny", [LISTED[2]], short, IN_STATE)
    assert one == "tiny already has 1 instance (c), being re-placed; not placing another (--replica adds a replica, using its memory again)"
    two = replica_notice("tiny", [LISTED[0], LISTED[2]], short, IN_STATE)
    assert two.startswith("tiny already has 2 instances (r, c), 1 of them being re-placed; not placing another")
    plain = replica_notice("tiny", [LISTED[0]], short, IN_STATE)
    assert plain == "tiny already has 1 instance (r); not placing another (--replica adds a replica, using its memory again)"
