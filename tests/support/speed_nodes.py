"""Two loopback nodes of unequal speed: one held to a CPU quota from its first instant
(``tests.support.cgroup``), both publishing their measured speed (docs/placement-speed.md).
Used by tests/test_speed_split_nodes.py and ``scripts/bench_split.py``."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.cgroup import CpuGroup
from tests.support.cluster import NodeProcess, converged, wait_until


class ThrottledNode(NodeProcess):
    """A ``NodeProcess`` moved into ``group`` as soon as it is spawned (its runners and its
    calibration, spawned later, are born inside)."""

    calibrate = True

    def __init__(self, data_dir: Path, group: CpuGroup, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(data_dir, **kw)
        self.group = group

    def spawn(self) -> None:
        super().spawn()
        assert self.proc is not None
        self.group.add(self.proc.pid)


def start_pair(tmp: Path, group: CpuGroup, flags: list[str], timeout: float = 180.0) -> tuple[NodeProcess, NodeProcess]:
    """(fast, slow): node ``fast`` then node ``slow`` (in ``group``) bootstrapping from it, each
    with ``flags``; returns once both are one cluster and both speeds are in State. The caller
    stops them (they are returned started, or stopped on failure here)."""
    fast = NodeProcess(tmp / "fast", extra_args=["--name", "fast", *flags])
    fast.calibrate = True
    slow: NodeProcess | None = None
    try:
        fast.start(timeout=timeout)
        slow = ThrottledNode(tmp / "slow", group, cluster=fast.cluster,
                             extra_args=["--name", "slow", "--bootstrap", fast.addrs()[0], *flags])
        slow.start(timeout=timeout)
        wait_until(lambda: converged([fast, slow], 2), timeout, what="2-node cluster")
        wait_until(lambda: len(speeds(fast)) == 2, timeout, interval=0.5, what="both nodes' speed published")
        return fast, slow
    except BaseException:
        for node in (slow, fast):
            if node is not None:
                node.stop()
        raise


def speeds(node: NodeProcess) -> dict[str, dict]:
    """Friendly name → published speed of every node ``GET /nodes`` lists with one."""
    return {n["friendly_name"]: n["speed"] for n in node.get("/nodes").json() if n.get("speed")}


def layer_ranges(view: dict) -> dict[str, tuple[int, int]]:
    """Node id → (start, end) layer of an instance view's shards."""
    return {s["node_id"]: (s["start_layer"], s["end_layer"]) for s in view["shards"]}


def greedy(node: NodeProcess, model: str, prompt: str, max_tokens: int) -> str:
    """The greedy (temperature 0) answer of ``model`` to ``prompt``."""
    r = node.chat(prompt, model, temperature=0, max_tokens=max_tokens)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def delete_and_wait(node: NodeProcess, instance_id: str, timeout: float = 60.0) -> None:
    """Delete an instance and wait until the node's State no longer has it."""
    r = httpx.delete(f"{node.url}/instances/{instance_id}", headers=node.headers, timeout=60)
    assert r.status_code == 200, r.text
    wait_until(lambda: node.get(f"/instances/{instance_id}").status_code == 404, timeout, what=f"{instance_id} deleted")
