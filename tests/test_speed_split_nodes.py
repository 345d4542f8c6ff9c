"""Two real loopback nodes, one held to a CPU quota by a cgroup this test makes (removed even
on failure): both publish their measured speed, the slow one measured slower; placement
splits a tiny synthetic model's layers by speed (the fast node gets more, previews say why),
``split=memory`` still gives the memory-proportional split, and the greedy output of both
splits equals one node's (docs/placement-speed.md)."""

from __future__ import annotations

import os

import pytest

from tests.conftest import tiny_models_dir
from tests.support import cgroup
from tests.support.speed_nodes import delete_and_wait, greedy, layer_ranges, speeds, start_pair

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not cgroup.available(), reason="needs root and the cgroup v1 cpu controller")]

MODEL = "tiny-speed"
QUOTA = 20
"""Percent of one core the slow node gets: below what the suite's load leaves each process
(~40 % on 2 cores under ``-n 3``) so that the quota, not the load, makes it slow; not lower: at
10 % the slow node (its node process and runner both held) reached its ring's listen more than
~30 s after the fast rank began to connect, MLX's connect retry window (worker/engine/distributed.py),
and the instance failed with "[ring] Couldn't connect"."""
PROMPT, TOKENS = "the quick brown fox", 24


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):  # type: ignore[no-untyped-def]
    return tiny_models_dir(tmp_path_factory, model=MODEL, n_layers=8, hidden_size=256, intermediate_size=768, seed=3)


def test_the_slow_node_gets_fewer_layers_and_the_output_is_one_nodes(tmp_path, models_dir):
    with cgroup.cpu_quota(f"exo-test-speed-{os.getpid()}", QUOTA) as group:
        fast, slow = start_pair(tmp_path, group, ["--models-dir", str(models_dir)], timeout=240)
        try:
            assert slow.proc is not None and slow.proc.pid in group.pids()
            figures = speeds(fast)
            assert figures["slow"]["decode_ns_per_kib"] >= 1.5 * figures["fast"]["decode_ns_per_kib"], figures
            ids = {n["friendly_name"]: n["node_id"] for n in fast.get("/nodes").json()}

            previews = fast.get("/instances/previews", params={"model": MODEL}).json()
            two = next(p for p in previews if p["sharding"] == "pipeline" and p["world_size"] == 2)
            assert two["error"] is None and two["split_reason"].startswith("by speed"), two
            assert two["memory_split_us_per_token"] > two["decode_us_per_token"] > 0, two

            one = fast.place_and_wait(MODEL, min_nodes=1, nodes=["fast"], timeout=240)
            reference = greedy(fast, MODEL, PROMPT, TOKENS)
            delete_and_wait(fast, one["instance_id"])
            assert reference

            spans = {}
            for split in ("speed", "memory"):
                view = fast.place_and_wait(MODEL, min_nodes=2, split=split, timeout=300)
                spans[split] = {node: end - start for node, (start, end) in layer_ranges(view).items()}
                assert greedy(fast, MODEL, PROMPT, TOKENS) == reference, split
                delete_and_wait(fast, view["instance_id"])
            assert abs(spans["memory"][ids["fast"]] - spans["memory"][ids["slow"]]) <= 1, spans  # equal memory
            assert spans["speed"][ids["fast"]] > spans["memory"][ids["fast"]], spans
            assert spans["speed"][ids["fast"]] > spans["speed"][ids["slow"]] >= 1, spans
        finally:
            for node in (slow, fast):
                node.stop()
    assert not (cgroup.CPU_ROOT / f"exo-test-speed-{os.getpid()}").exists()
