"""Links measured and used, on namespaces joined by links of chosen speed (root; docs/links.md).

Real node processes in namespaces the test builds (``tests/support/net/link_lab.py``): fast links are
veth pairs, slow ones cross a router namespace with ``tbf`` (bandwidth) and a delaying relay
(latency; the kernel has no ``netem``). The tiny synthetic model, placed across two or three
nodes so that the ring crosses the links.
"""

from __future__ import annotations

import os
import shutil
import time

import httpx
import pytest

from tests.support.cluster import NetnsNodeProcess, nodes_cleanup, wait_until
from tests.support.net.link_lab import LinkLab
from tests.support.net.netns_links import decode_rate, figures, models_dir, ordered_dirs, place, preview_cost, served_on_two, start_lab_nodes, wait_measured

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("iptables") is None
                       or shutil.which("tc") is None, reason="needs root, iproute2, tc and iptables"),
]

DELAY = 0.03
"""Seconds the slow link's relay adds in each direction (RTT +60 ms): a decode step of the
2-node ring crosses the link both ways, so over it decode stays below ~16 tokens/s, well under
the fast link's rate even on a loaded machine (with +20 ms, a whole-suite run at load ~9
measured 28.2 tok/s fast vs 29.8 slow: the fast link's decode was CPU-bound by then)."""


@pytest.mark.timeout(900)
def test_two_links_measured_the_ring_takes_the_fast_one_and_survives_its_loss(tmp_path, models_dir):
    """Two nodes joined by a fast link and a slow one (tbf 20 Mbit/s, +60 ms RTT): both
    addresses of each peer are in State with RTTs that differ by the relay's delay; the ring
    of a 2-node pipeline runs over the fast one; its preview costs less and it decodes faster
    than the same instance over the slow one; with the fast link down the model is served
    again (re-placed over the slow link) within the bounds of a lost link."""
    nodes: list[NetnsNodeProcess] = []
    with LinkLab(2, [(0, 1, "fast"), (0, 1, "slow")], rate="20mbit", delay=DELAY) as lab, nodes_cleanup(nodes):
        ids = start_lab_nodes(lab, ordered_dirs(tmp_path, 2), models_dir, nodes)
        (f0, f1), (s0, s1) = lab.addresses
        wait_measured(nodes[0], ids, [(0, 1, [f1, s1]), (1, 0, [f0, s0])])
        for a, b, fast, slow in ((0, 1, f1, s1), (1, 0, f0, s0)):
            got = figures(nodes[0], ids[a], ids[b])
            print(f"link {a}->{b}: fast {got[fast]}, slow {got[slow]}")
            assert got[slow]["rtt_us"] - got[fast]["rtt_us"] >= 0.6 * 2 * DELAY * 1e6  # +60 ms shaped, 40 % slack
            assert got[fast]["bytes_per_s"] > 2 * got[slow]["bytes_per_s"]  # the slow link is shaped to 2.5 MB/s
        place(nodes[0], min_nodes=2)
        # a runner that fails while loading on a busy machine is re-placed (maybe on one node
        # first, then the placed size is restored): wait for the 2-node instance that answers
        ips = wait_until(lambda: served_on_two(nodes[0]), 240, interval=2, what="a 2-node instance answering")
        assert set(ips) == {f0, f1}
        fast_cost, fast_rate = preview_cost(nodes[0], 2), decode_rate(nodes[0])

        lab.down(0)
        t_down = time.monotonic()

        # docs/links.md#when-a-link-changes: the fast addresses are retracted within a round
        # (<= 16.5 s) and two refusals 2 s apart; the master then fails the ring at once and
        # re-places it over the slow link (never onto the dead link's other end); the tiny model
        # loads in 3-10 s (60 s at most, the loading bound). Should the retraction not come,
        # the wedged ranks are killed as stuck after 45 s: 45 + 5 (confirm) + 60 + 10 = 120 s,
        # with 1.5x slack for a loaded machine. Measured at load 2-6: 12.8, 13.7 and 16.5 s (was 54-103 s).
        ips = wait_until(lambda: served_on_two(nodes[0]), 180, interval=2, what="served again by a 2-node instance")
        print(f"fast link down: served again by 2 nodes after {time.monotonic() - t_down:.1f} s, ring {ips}")
        assert set(ips) == {s0, s1}
        slow_cost, slow_rate = preview_cost(nodes[0], 2), decode_rate(nodes[0])
        print(f"preview cost fast {fast_cost} us/token, slow {slow_cost}; decode fast {fast_rate:.1f} tok/s, slow {slow_rate:.1f}")
        assert fast_cost < slow_cost and fast_rate > slow_rate


@pytest.mark.timeout(600)
def test_three_nodes_the_rank_order_crosses_the_slow_pair_least(tmp_path, models_dir):
    """Three nodes, the two with the smallest ids (which memory and ids would put first) joined
    only by a slow link: a 2-node instance avoids that pair (it crosses it 0 times); a 3-node
    instance is placed with rank 0 on the pair (the closing hop is not asserted: see below)."""
    nodes: list[NetnsNodeProcess] = []
    with LinkLab(3, [(0, 2, "fast"), (1, 2, "fast"), (0, 1, "slow")], rate="20mbit", delay=DELAY) as lab, nodes_cleanup(nodes):
        # node 2 has less memory, so rank 0 (the most memory) is one of the slow pair's nodes
        ids = start_lab_nodes(lab, ordered_dirs(tmp_path, 3), models_dir, nodes, extra={2: ["--memory-limit", "1GiB"]})
        addr = lab.addresses
        wait_measured(nodes[0], ids, [(0, 2, [addr[0][1]]), (2, 0, [addr[0][0]]), (1, 2, [addr[1][1]]),
                                      (2, 1, [addr[1][0]]), (0, 1, [addr[2][1]]), (1, 0, [addr[2][0]])])
        two = place(nodes[0], min_nodes=2)
        pair = {s["node_id"] for s in nodes[0].get(f"/instances/{two}").json()["shards"]}
        assert pair != {ids[0], ids[1]}, "the 2-node ring crosses the slow pair"
        assert httpx.delete(f"{nodes[0].url}/instances/{two}", timeout=60).status_code == 200
        three = place(nodes[0], min_nodes=3)
        order = [s["node_id"] for s in nodes[0].get(f"/instances/{three}").json()["shards"]]
        hops = {frozenset((order[r], order[r + 1])) for r in range(2)}
        print(f"3-node rank order {[ids.index(n) for n in order]}")
        assert order[0] in (ids[0], ids[1]), "rank 0 is one of the slow pair (node 2 has less memory)"
        # Not asserted: that the slow pair is the closing hop. With the tiny model a hop's
        # hidden state is 256 bytes (~0.1 ms on the slow link), while the two directions of one
        # link are measured apart and differ by tens of ms under load, so the choice between
        # the two directions follows RTT noise (seen: [0, 1, 2] at load 30; docs/links.md).
        print(f"3-node: hidden states cross the slow pair: {frozenset((ids[0], ids[1])) in hops}")
