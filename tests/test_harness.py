"""The test harness's own rules (``tests/support/cluster.py``): the ports it picks for listeners
started later, and a node start that lost its API port to another socket (a port from
the ephemeral range can become some connection's local port before the node binds it)."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from master.placement.ring import RING_BASE_PORT
from tests.support.cluster import NodeProcess, _ephemeral_range, free_ports

pytestmark = pytest.mark.integration


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=1, max_value=12))
def test_picked_ports_are_distinct_free_and_below_the_ephemeral_and_ring_ranges(n: int) -> None:
    ports = free_ports(n)
    assert len(ports) == n and len(set(ports)) == n
    top = min(_ephemeral_range()[0], RING_BASE_PORT)
    for port in ports:
        assert 10000 <= port < top
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free


def test_a_node_whose_api_port_is_taken_starts_on_another(tmp_path) -> None:
    taken = socket.socket()
    node = NodeProcess(tmp_path / "a")
    try:
        taken.bind(("127.0.0.1", node.api_port))
        taken.listen()
        first = node.api_port
        node.start(timeout=60)
        assert node.api_port != first
        assert node.get("/health").status_code == 200
        assert f"port {first} on 127.0.0.1 is not available" in node.log_path.read_text()
    finally:
        node.stop()
        taken.close()
