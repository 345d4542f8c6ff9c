"""The MLX ring listens only at the address placement chose (docs/cluster.md): its traffic is
plain TCP, so a rank must never listen on every interface (``0.0.0.0``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from exo_p2p.cluster.mesh import ip_of
from tests.support.cluster import REPO, free_port
from worker.engine.distributed import hostfile_entries


@pytest.mark.parametrize("bad", ["0.0.0.0:5000", "[::]:5000", ":5000"])
def test_hostfile_refuses_an_unspecified_address(bad):
    with pytest.raises(ValueError, match="unspecified|ip:port"):
        hostfile_entries(["10.0.0.1:5000", bad])
    assert hostfile_entries(["10.0.0.1:5000", "10.0.0.2:5001"]) == [["10.0.0.1:5000"], ["10.0.0.2:5001"]]


def test_topology_edge_ip_is_never_unspecified():
    assert ip_of(["/ip4/0.0.0.0/tcp/1", "/ip4/10.0.0.7/tcp/1"]) == "10.0.0.7"
    assert ip_of(["/ip4/0.0.0.0/tcp/1"]) == ""


_RANK0 = """
import json, os, sys
import mlx.core as mx
from worker.engine.distributed import hostfile_entries
path = sys.argv[1]
with open(path, "w") as f:
    json.dump(hostfile_entries(sys.argv[2:]), f)
os.environ["MLX_RANK"] = "0"
os.environ["MLX_HOSTFILE"] = path
mx.distributed.init(strict=True, backend="ring")
"""


@pytest.mark.integration
def test_ring_rank_listens_only_at_its_placement_address(tmp_path):
    """A real MLX ring rank 0 (its neighbour never comes): its listening socket is bound to
    the hostfile's address for rank 0 (127.0.0.3 here), not to 0.0.0.0."""
    port = free_port()
    addresses = [f"127.0.0.3:{port}", f"127.0.0.4:{free_port()}"]
    proc = subprocess.Popen(
        [sys.executable, "-c", _RANK0, str(tmp_path / "hosts.json"), *addresses],
        cwd=REPO, env={**os.environ}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        listening: list = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not listening:
            try:
                conns = psutil.Process(proc.pid).net_connections(kind="tcp")
            except psutil.NoSuchProcess:
                break
            listening = [c for c in conns if c.status == psutil.CONN_LISTEN]
            time.sleep(0.2)
        assert listening, "rank 0 never listened"
        assert {(c.laddr.ip, c.laddr.port) for c in listening} == {("127.0.0.3", port)}
        assert json.loads((tmp_path / "hosts.json").read_text())[0] == [addresses[0]]
    finally:
        proc.kill()
        proc.wait(10)
