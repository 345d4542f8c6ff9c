"""An idle instance moves onto a faster ring when its link comes back (``master.relink``; root;
docs/links.md#when-a-link-changes).

Two nodes joined by a fast link and a slow one (``tests/support/net/link_lab.py``: tbf 20 Mbit/s and +20 ms
RTT through the delaying relay). The 2-node instance is placed while the fast link is down, so
its ring runs over the slow one; then the fast link comes back while a long request streams:
the instance does not move while the request is in flight; once it has ended it moves onto the
fast link (a successor placed beside it, ``master.restore``'s switch), a request streamed
during the switch is whole, and it moves once only.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

import httpx
import pytest

from master.relink import RELINK_CHECK_EVERY, RELINK_SETTLE
from tests.support.cluster import NetnsNodeProcess, nodes_cleanup, state_of, wait_until
from tests.support.net.link_lab import LinkLab
from tests.support.net.netns_links import MODEL, figures, models_dir, ordered_dirs, place, ring_ips, start_lab_nodes, wait_measured

__all__ = ["models_dir"]  # the module's fixture, shared

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("iptables") is None
                       or shutil.which("tc") is None, reason="needs root, iproute2, tc and iptables"),
]

SLOW_DELAY = 0.025
"""Seconds the slow link's relay adds in each direction here: every token crosses the slow link
twice (the hidden state forward, the token back), so a token takes ≥ 50 ms over it (measured:
95 ms at load 3-6; 32 ms with 10 ms of delay)."""
LONG = 2000
"""Tokens of the request in flight when the fast link returns (the tiny model's context is
2048): ≥ 100 s over the slow link, longer than ``RELINK_SETTLE + RELINK_CHECK_EVERY`` (65 s)
plus measuring the fast link again (a few s)."""
MOVE_BOUND = 180.0
"""Seconds from the end of the request in flight to the old instance deleted and the moved one
serving: ``RELINK_SETTLE`` (60) + a check (5) + loading the tiny model on two ranks (3-10 s
quiet, 60 s at most: the loading bound) + the switch (0.25 s passes) = 125 s, with slack for a
loaded machine."""


def stream(node, max_tokens: int) -> dict:  # type: ignore[no-untyped-def]
    """One greedy streamed chat of ``max_tokens`` tokens (``ignore_eos``) in a thread: returns a
    dict filled with ``finish_reason``, ``tokens`` (usage), ``error`` and ``ended_at``
    (monotonic), and ``thread``."""
    out: dict = {"finish_reason": None, "tokens": None, "error": None, "ended_at": None}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "count"}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}

    def go() -> None:
        try:
            with httpx.stream("POST", node.url + "/v1/chat/completions", json=body,
                              timeout=httpx.Timeout(120, connect=10)) as r:
                if r.status_code != 200:
                    out["error"] = f"HTTP {r.status_code}: {r.read()!r}"
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        out["error"] = chunk["error"]
                    for choice in chunk.get("choices") or []:
                        out["finish_reason"] = choice.get("finish_reason") or out["finish_reason"]
                    if chunk.get("usage"):
                        out["tokens"] = chunk["usage"]["completion_tokens"]
        except Exception as exc:  # noqa: BLE001 - the assertion reports it
            out["error"] = repr(exc)
        out["ended_at"] = time.monotonic()

    out["thread"] = threading.Thread(target=go, daemon=True)
    out["thread"].start()
    return out


def whole(result: dict, max_tokens: int) -> bool:
    return result["error"] is None and result["finish_reason"] == "length" and result["tokens"] == max_tokens


def instances(node) -> dict:  # type: ignore[no-untyped-def]
    return (state_of(node) or {}).get("instances") or {}


@pytest.mark.timeout(900)
def test_an_idle_instance_moves_onto_the_fast_link_when_it_returns_never_while_a_request_streams(tmp_path, models_dir):
    nodes: list[NetnsNodeProcess] = []
    with LinkLab(2, [(0, 1, "fast"), (0, 1, "slow")], rate="20mbit", delay=SLOW_DELAY) as lab, nodes_cleanup(nodes):
        ids = start_lab_nodes(lab, ordered_dirs(tmp_path, 2), models_dir, nodes)
        (f0, f1), (s0, s1) = lab.addresses
        wait_measured(nodes[0], ids, [(0, 1, [f1, s1]), (1, 0, [f0, s0])])

        lab.down(0)
        wait_until(lambda: not figures(nodes[0], ids[0], ids[1]).get(f1) and not figures(nodes[0], ids[1], ids[0]).get(f0),
                   90, interval=1, what="the fast link's figures retracted")
        # the connection the nodes had over the fast link went with it: the peer may time out
        # and come back over the slow one before a 2-node placement can be asked for
        wait_until(lambda: len((state_of(nodes[0]) or {}).get("nodes") or {}) == 2, 90, interval=1,
                   what="both nodes in the cluster over the slow link")
        first = place(nodes[0], min_nodes=2)
        assert set(ring_ips(nodes[0], first)) == {s0, s1}, "placed over the slow link while the fast one is down"

        busy = stream(nodes[0], LONG)
        wait_until(lambda: next(iter(instances(nodes[0]).values()), {}) and any(
            t.get("status") == "running" for t in ((state_of(nodes[0]) or {}).get("tasks") or {}).values()), 60,
            what="the long request running")
        lab.up(0)
        wait_measured(nodes[0], ids, [(0, 1, [f1]), (1, 0, [f0])], timeout=60)
        t_measured = time.monotonic()
        print(f"fast link measured again {t_measured:.0f}")

        # while the request streams: no successor, whatever the fast link's gain
        while busy["ended_at"] is None:
            assert list(instances(nodes[0])) == [first], f"moved with a request in flight: {instances(nodes[0])}"
            time.sleep(1)
        assert whole(busy, LONG), busy
        held = busy["ended_at"] - t_measured
        print(f"the request ended {held:.1f} s after the fast link was measured; no move meanwhile")
        assert held > RELINK_SETTLE + RELINK_CHECK_EVERY, "the request ended too soon to show the rule waits for it"

        def successor() -> str | None:
            return next((i for i, inst in instances(nodes[0]).items() if inst.get("replaces") == first), None)

        new = wait_until(successor, MOVE_BOUND, interval=0.25, what="a successor on the fast link")
        t_moved = time.monotonic() - busy["ended_at"]
        during = stream(nodes[0], 64)  # streams while the successor loads / the switch happens
        moved = instances(nodes[0])[new]
        print(f"moved {t_moved:.1f} s after the request ended: {moved.get('moved')}")
        assert moved.get("restores") and "us/token" in moved.get("moved", "")
        assert set(ring_ips(nodes[0], new)) == {f0, f1}

        during["thread"].join(120)
        assert whole(during, 64), during
        try:
            wait_until(lambda: list(instances(nodes[0])) == [new] or None, MOVE_BOUND, interval=0.5,
                       what="the old instance deleted once idle")
        except TimeoutError:
            timed_out = [n for n in nodes if "node timed out" in n.log_path.read_text(errors="replace")]
            assert not timed_out, ("a node was timed out during the switch (its heartbeats starved while the "
                                   "successor's runners started on a loaded machine): both instances failed and "
                                   f"the model was re-placed instead; instances now {list(instances(nodes[0]))}")
            raise
        records = [json.loads(line) for n in nodes for line in n.log_path.read_text(errors="replace").splitlines()
                   if line.startswith("{") and '"request_id"' in line]
        served_by = [r.get("instance") for r in records if r.get("completion_tokens") == 64]
        print(f"the request streamed during the switch was served by {served_by} (old {first}, new {new})")
        print(f"switched {time.monotonic() - busy['ended_at']:.1f} s after the request ended")
        after = stream(nodes[0], 16)
        after["thread"].join(120)
        assert whole(after, 16), after

        time.sleep(RELINK_CHECK_EVERY * 4)  # no flapping: four more checks, no further move
        assert list(instances(nodes[0])) == [new]
        master_log = next(n for n in nodes if "became master" in n.log_path.read_text(errors="replace"))
        assert "moving an idle instance to a cheaper ring" in master_log.log_path.read_text(errors="replace")
