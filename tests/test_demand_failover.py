"""The keep-alive deadline survives a master failover (docs/models.md "Placement on demand and
idle unload"): the deadline is in State (``State.usage``), so the master elected after the
old one is killed during the idle window unloads the instance on time, not later, not earlier.

Three nodes, as tests/test_master_failover_stream.py: the instance and the request live on
the two followers, so only the master dies.
"""

from __future__ import annotations

import time

import pytest

from tests.conftest import NEW_MASTER, T_GONE, tiny_models_dir
from tests.support.cluster import Cluster, agreement, self_id, state_of, wait_until

pytestmark = pytest.mark.integration
ollama = pytest.importorskip("ollama")

MODEL = "tiny"
KEEP = 20.0  # seconds: longer than a failover (T_GONE + NEW_MASTER), so the new master is the one to unload
SLACK = 5.0  # load on a shared 2-core machine (docs/testing.md "Bounds")


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tiny_models_dir(tmp_path_factory, n_layers=2, hidden_size=64, intermediate_size=128, seed=7, context_length=4096)


def test_a_new_master_unloads_an_idle_instance_on_the_old_deadline(tmp_path, models_dir) -> None:
    cluster = Cluster(tmp_path, 3, extra_args=["--models-dir", str(models_dir)]).start()
    try:
        wait_until(lambda: agreement(cluster.nodes, 3), 30, what="3-node agreement")
        ids = {self_id(n): n for n in cluster.nodes}
        master_id = state_of(cluster.nodes[0])["master"]
        f1, f2 = (n for i, n in sorted(ids.items()) if i != master_id)
        placed = f2.place_and_wait(MODEL, timeout=120, nodes=[self_id(f1)], keep_alive=f"{KEEP:g}s")
        iid = placed["instance_id"]
        reply = ollama.Client(host=f2.url, timeout=120).chat(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                              options={"num_predict": 4})
        assert reply.message.content

        def settled() -> dict | None:  # the request's end recorded (FinishGeneration), no task left
            s = state_of(f1) or {}
            usage = s.get("usage", {}).get(iid)
            return usage if usage and usage["served"] and not s.get("tasks") else None

        usage = wait_until(settled, 10, what="the request's end in State")
        deadline = usage["last_used"] + KEEP
        ids[master_id].kill()
        wait_until(lambda: (state_of(f1) or {}).get("master") not in (None, master_id), T_GONE + NEW_MASTER + SLACK,
                   what="a new master")
        assert time.time() < deadline - 1, "the failover took the whole keep-alive: the test proves nothing"
        wait_until(lambda: iid not in (state_of(f1) or {}).get("instances", {}), deadline - time.time() + SLACK,
                   interval=0.1, what="the idle instance unloaded by the new master")
        assert time.time() >= deadline - 0.5, f"unloaded {deadline - time.time():.1f} s before its deadline"
    finally:
        cluster.stop()
