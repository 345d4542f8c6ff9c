"""Probing a node's port from outside."""

from __future__ import annotations

import json

from tests.support.cluster import NodeProcess


def _probe_port(node: NodeProcess) -> int | None:
    """The port of the node's link probe listener (``exo_p2p.links.probe_server``: it logs it
    once at start), None before it listens."""
    for line in node.log_path.read_text(errors="replace").splitlines():
        if '"link probe listener"' in line:
            return int(json.loads(line)["port"])
    return None
