"""A split of two real nodes heals (docs/cluster.md "Claims"; ``exo_p2p.cluster.election`` rule 4):
the field case, reproduced with node processes on 127.0.0.1.

History: A and B form a cluster; B stops; A restarts alone three times (terms 2-4, a log
of its own); A stops; B starts alone (term 2, another log from the same prefix); B stops;
A starts (term 5); B starts, bootstrapped to A. B refuses A's claim (a diverged log at term
5, more than one above B's 2) and claims term 3 itself; A admits B's claim (a term below its
own) but outranks it (more committed events). Before rule 4 both stayed masters for good;
now A yields to B within ``CLAIM_PROBE_TIMEOUT + RIVAL_YIELD_AFTER`` of B's claim.
"""

from __future__ import annotations

import time

import pytest

from exo_p2p import defaults
from tests.support.cluster import NodeProcess, converged, nodes_cleanup, state_of, wait_until

pytestmark = pytest.mark.integration

LOAD_SLACK = 10.0
"""Seconds of slack over the rule's bound for a loaded 2-core machine (docs/testing.md "Bounds")."""
BOUND = defaults.CLAIM_PROBE_TIMEOUT + defaults.RIVAL_YIELD_AFTER + LOAD_SLACK


def _master_term(node: NodeProcess) -> tuple[str, int] | None:
    s = state_of(node)
    return None if s is None or s["master"] != s["node_id"] else (s["node_id"], s["term"])


def _start(node: NodeProcess, bootstrap: list[str] = ()) -> None:  # type: ignore[assignment]
    node.extra_args = [x for addr in bootstrap for x in ("--bootstrap", addr)]
    node.start()


def _restart_alone(node: NodeProcess) -> tuple[str, int]:
    """Start ``node`` with no bootstrap (its peers are down) and wait until it claims."""
    _start(node)
    return wait_until(lambda: _master_term(node), 40, what=f"{node.data_dir.name} master")


@pytest.mark.timeout(420)
def test_two_live_masters_terms_apart_with_diverged_logs_become_one(tmp_path):
    name = f"split-{time.monotonic_ns() % 10**9}"
    a = NodeProcess(tmp_path / "a", cluster=name)
    b = NodeProcess(tmp_path / "b", cluster=name)
    nodes = [a, b]
    with nodes_cleanup(nodes):
        a.start()
        wait_until(lambda: _master_term(a), 40, what="a master")
        _start(b, a.addrs())
        wait_until(lambda: converged(nodes, 2), 60, what="a and b in one cluster")
        b.stop()
        for _ in range(3):  # A alone: a term per start, a log of its own
            a.stop()
            _restart_alone(a)
        a.stop()
        _restart_alone(b)  # B alone: a claim from the shared prefix
        b.stop()
        a_id, _ = _restart_alone(a)
        _start(b, a.addrs())
        b_id = state_of(b)["node_id"]
        # B refuses A's claim and claims itself: two masters at terms 2+ apart
        both = wait_until(lambda: (_master_term(a), _master_term(b)) if _master_term(b) and _master_term(a) else None,
                          30, what="b claims while a is master")
        split_at = time.monotonic()
        (_, a_term), (_, b_term) = both
        assert a_term - b_term >= 2, both
        one = wait_until(lambda: converged(nodes, 2) and state_of(a)["master"], BOUND, what="one master")
        took = time.monotonic() - split_at
        print(f"split a term {a_term} / b term {b_term}: one master ({one}) after {took:.1f} s (bound {BOUND:.0f} s)")
        assert one == b_id, (one, a_id, b_id)  # the admitting side (A) yielded
