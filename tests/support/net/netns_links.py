"""Nodes in network namespaces of a link lab: starting them, placing, reading link figures."""

from __future__ import annotations

import os
import time

import pytest

from tests.support.cluster import NetnsNodeProcess, agreement, self_id, start_all, state_of, wait_until
from tests.conftest import tiny_models_dir
from tests.support.net.link_lab import LinkLab


MODEL = "tiny"


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tiny_models_dir(tmp_path_factory, n_layers=4, seed=4)


def ordered_dirs(tmp_path, n: int) -> list:
    """Data dirs whose identities are made now, sorted by node id (dir i has the i-th smallest
    id), so a test can put a link between the nodes placement would prefer on memory and ids."""
    from exo_p2p.net.identity import load_or_create_identity

    dirs = [tmp_path / f"d{i}" for i in range(n)]
    return sorted(dirs, key=lambda d: load_or_create_identity(d).node_id)


def start_lab_nodes(lab: LinkLab, dirs: list, models_dir, nodes: list, extra: dict[int, list[str]] | None = None) -> list[str]:
    """One node per namespace listening on every interface (so on every lab link); node 0
    first, each other node bootstrapped to it over the first lab link they share (every node
    must share one with node 0). Returns the node ids."""
    name = f"links-{os.getpid()}-{time.monotonic_ns() % 10**9}"

    def node(i: int, args: list[str]) -> NetnsNodeProcess:
        return NetnsNodeProcess(dirs[i], netns=lab.namespaces[i], listen_host="0.0.0.0", api_host=lab.mgmt_ip(i),
                                cluster=name, extra_args=["--models-dir", str(models_dir), *args, *(extra or {}).get(i, [])])

    first = node(0, [])
    nodes.append(first)
    first.start()

    def boot(i: int) -> str:  # node 0's address on the first lab link between it and node i
        k = next(k for k, (a, b, _) in enumerate(lab.links) if {a, b} == {0, i})
        near = lab.addresses[k][0 if lab.links[k][0] == 0 else 1]
        return next(a for a in first.addrs() if a.startswith(f"/ip4/{near}/"))

    nodes.extend(node(i, ["--bootstrap", boot(i)]) for i in range(1, lab.n))
    start_all(nodes[1:])
    wait_until(lambda: agreement(nodes, lab.n), 60, what=f"cluster of {lab.n}")
    return [self_id(n) for n in nodes]


def figures(node, source: str, sink: str) -> dict:
    return ((state_of(node) or {}).get("links", {}).get(source, {}) or {}).get(sink, {}) or {}


def wait_measured(node, ids: list[str], pairs: list[tuple[int, int, list[str]]], timeout: float = 90) -> None:
    """Until State holds figures, bandwidth included, of every listed address of each pair."""
    def done():
        return all(
            all(figures(node, ids[a], ids[b]).get(ip, {}).get("bytes_per_s") for ip in ips) for a, b, ips in pairs
        ) or None

    wait_until(done, timeout, interval=1, what="every address measured")


def decode_rate(node, tokens: int = 48) -> float:
    """Tokens per second of one greedy completion of ``tokens`` tokens (after a warm-up)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "count"}], "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True}
    r = node.post("/v1/chat/completions", json={**body, "max_tokens": 4}, timeout=120)
    assert r.status_code == 200, r.text
    start = time.monotonic()
    r = node.post("/v1/chat/completions", json=body, timeout=180)
    took = time.monotonic() - start
    assert r.status_code == 200, r.text
    return r.json()["usage"]["completion_tokens"] / took


def ring_ips(node, instance_id: str) -> list[str]:
    """Per rank, the IP its ring neighbour reaches it at (State's shard, ``ring_address``)."""
    inst = state_of(node)["instances"][instance_id]
    return [s["ring_address"].rsplit(":", 1)[0] for s in inst["shards"]]


def preview_cost(node, world: int) -> int:
    items = node.get("/instances/previews", params={"model": MODEL}).json()
    p = next(p for p in items if p["sharding"] == "pipeline" and p["world_size"] == world and not p.get("error"))
    return p["network_us_per_token"]


def served_on_two(node) -> list[str] | None:  # type: ignore[no-untyped-def]
    """The ring IPs (``ring_ips``) of a ready 2-node instance of the model that answers a
    short request, read after the request, or None."""
    try:
        ready = [i for i in node.get("/instances").json() if i["status"] == "ready" and len(i["shards"]) == 2]
        if not ready or decode_rate(node, tokens=8) <= 0:
            return None
        return ring_ips(node, ready[0]["instance_id"])
    except Exception:  # noqa: BLE001 - failing until re-placed (and an instance replaced meanwhile)
        return None


def place(node, **body) -> str:  # type: ignore[no-untyped-def]
    """Place the model; the id of a ready instance of ``min_nodes`` nodes (the placed one, or
    its re-placement when a runner failed on the way: a loaded machine can make a node miss
    heartbeats while runners load)."""
    r = node.post("/instances", json={"model": MODEL, **body}, timeout=120)
    assert r.status_code == 201, r.text

    size = body.get("min_nodes", 1)

    def ready() -> str | None:
        return next((i["instance_id"] for i in node.get("/instances").json()
                     if i["status"] == "ready" and len(i["shards"]) == size), None)

    return wait_until(ready, 180, what="instance ready")
