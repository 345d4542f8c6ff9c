"""A crowd of idle connections to the link probe port cannot starve the probes of members
(``exo_p2p.links.probe_server``, docs/security.md#listeners): 64 idle connections from a
host that is not a peer (a plain socket client here, each re-opened at once when closed)
while real probes run, in-process and between two real nodes."""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from pathlib import Path

import pytest
import trio

from exo_p2p.links.figures import RTT_EVERY
from exo_p2p.links.measure import measure
from exo_p2p.links.probe_server import PER_SOURCE_WAITING, ProbeServer
from exo_p2p.links.prober import TICK
from tests.support.cluster import NodeProcess, converged, nodes_cleanup, state_of, wait_until
from tests.support.net.probes import _probe_port

pytestmark = pytest.mark.integration
CROWD = 64
"""Idle connections the crowd holds open at once."""


class IdleCrowd:
    """``n`` plain TCP connections to ``127.0.0.1:port`` held open by a thread (odd ones send
    one byte, which passes ``TCP_DEFER_ACCEPT``, then nothing), each re-opened as soon as the
    server closes it, for at most ``seconds``. ``opened``: connections opened in all."""

    def __init__(self, port: int, n: int = CROWD, seconds: float = 120.0) -> None:
        self.port, self.n, self.deadline = port, n, time.monotonic() + seconds
        self.opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, i: int) -> socket.socket | None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            if i % 2:
                sock.sendall(b"x")
        except OSError:
            return None
        self.opened += 1
        return sock

    def _run(self) -> None:
        socks: dict[int, socket.socket | None] = {i: self._open(i) for i in range(self.n)}
        try:
            while not self._stop.is_set() and time.monotonic() < self.deadline:
                live = {s: i for i, s in socks.items() if s is not None}
                readable = select.select(list(live), [], [], 0.02)[0] if live else []
                for sock in readable:
                    try:
                        if sock.recv(1024):
                            continue
                    except OSError:
                        pass
                    sock.close()
                    socks[live[sock]] = None
                for i in [i for i, s in socks.items() if s is None]:
                    socks[i] = self._open(i)
        finally:
            for sock in socks.values():
                if sock is not None:
                    sock.close()

    def __enter__(self) -> "IdleCrowd":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_probes_are_served_while_a_crowd_holds_64_idle_connections() -> None:
    """20 probes one after the other, each with its ticket, while the crowd holds 64 idle
    connections: every one is served (the crowd evicts itself, never a prober)."""
    server = ProbeServer()
    failures: list[str] = []
    took: list[float] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.run, ["127.0.0.1"])
            with IdleCrowd(port, seconds=60) as crowd:
                with trio.fail_after(10):
                    while server.room.counts["evicted"] < CROWD:  # the crowd is on: its share is full
                        await trio.sleep(0.05)
                for _ in range(20):
                    token, proof = server.issue(1, "peer").tickets[0]
                    start = time.monotonic()
                    try:
                        await measure("127.0.0.1", port, token, proof, bandwidth=lambda rtt: False)
                    except ConnectionError as exc:
                        failures.append(repr(exc))
                    took.append(time.monotonic() - start)
                    await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
        print(f"crowd opened {crowd.opened} connections; probes: {len(took) - len(failures)} of {len(took)} "
              f"served, slowest {max(took):.3f} s; served {server.served} ops, refused {server.refused}, "
              f"room {server.room.counts}")

    trio.run(main)
    assert failures == [], failures
    assert server.room.counts["evicted"] >= CROWD


def test_links_between_real_peers_are_measured_within_a_round_under_a_crowd(tmp_path: Path, models_dir) -> None:
    """Two real nodes; once they measured each other, each probe port gets a crowd of 64 idle
    connections from a plain socket client: within one probe round (``RTT_EVERY`` + a
    ``TICK``, and 10 s for a loaded machine) each node has served new probes of the other,
    and both directions' figures stay in State."""
    cluster = f"probe-guard-{os.getpid()}"
    nodes: list[NodeProcess] = []
    with nodes_cleanup(nodes):
        a = NodeProcess(tmp_path / "a", cluster=cluster, extra_args=["--name", "a", "--models-dir", str(models_dir)])
        nodes.append(a.start())
        b = NodeProcess(tmp_path / "b", cluster=cluster, extra_args=["--name", "b", "--models-dir", str(models_dir),
                                                                     "--bootstrap", a.addrs()[0]])
        nodes.append(b.start())
        wait_until(lambda: converged(nodes, 2), 60, what="2-node cluster")
        wait_until(lambda: len(_figures(a)) == 2, 30, interval=0.5, what="both directions measured")
        ports = [wait_until(lambda n=n: _probe_port(n), 30, what="probe port") for n in nodes]
        with IdleCrowd(ports[0]) as crowd_a, IdleCrowd(ports[1]) as crowd_b:
            wait_until(lambda: all(_counters(n)["link_probes_refused"] >= CROWD for n in nodes), 20,
                       what="the crowds being refused")
            before = {n.url: _counters(n) for n in nodes}
            start = time.monotonic()
            round_s = RTT_EVERY + TICK + 10.0

            def served_again() -> bool:
                now = {n.url: _counters(n) for n in nodes}
                return all(now[u]["link_probes_served"] > before[u]["link_probes_served"] for u in now)

            wait_until(served_again, round_s, interval=0.5, what="a probe round served under the crowd")
            took = time.monotonic() - start
            after = {n.url: _counters(n) for n in nodes}
            print(f"crowds opened {crowd_a.opened} + {crowd_b.opened} connections; probes served again after "
                  f"{took:.1f} s (a round: {RTT_EVERY} s); " + "; ".join(
                      f"{u}: served +{after[u]['link_probes_served'] - before[u]['link_probes_served']}, refused "
                      f"+{after[u]['link_probes_refused'] - before[u]['link_probes_refused']}" for u in after))
            assert len(_figures(a)) == 2 and len(_figures(b)) == 2
            assert all(n.proc.poll() is None for n in nodes)


def _counters(node: NodeProcess) -> dict:
    return (state_of(node) or {}).get("counters") or {"link_probes_refused": -1, "link_probes_served": -1}


def _figures(node: NodeProcess) -> list[dict]:
    s = state_of(node) or {}
    return [f for sinks in s.get("links", {}).values() for figs in sinks.values() for f in figs.values()]


assert PER_SOURCE_WAITING < CROWD  # the crowd is larger than one source's share of the room
