"""The bulk model-transfer path cannot be starved or misplaced (docs/models.md#how-the-bytes-travel):
ticketless connections never take a ticket holder's slot, the listener binds only where the
cluster listens, and a fetch whose bulk path fails finishes over the libp2p stream."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import psutil
import pytest
import structlog
import trio

from exo_p2p.models.transfer import bulk_client
from exo_p2p.models.transfer.bulk import _REPLY, TOKEN_BYTES, BulkServer, BulkTicket, listen_hosts
from exo_p2p.models.transfer.bulk_client import FELL_BACK, fetch_getter
from exo_p2p.models.transfer.chunk_sets import shard_chunks
from exo_p2p.models.transfer.fetch import fetch_chunks
from exo_p2p.models.manifest import build_manifest, chunk_span
from exo_p2p.models.copies.partial import PartialModel
from exo_p2p.models.transfer.protocols import LocalModel
from tests.support.models.synthetic_models import make_synthetic_model
from exo_p2p.types.manifest import ModelManifest
from tests.support.cluster import NodeProcess, converged, make_secret, nodes_cleanup, self_id, wait_until
from tests.support.net.probes import _probe_port

pytestmark = pytest.mark.integration
MODEL = "tiny-bulk"
FLOOD = 200
"""Ticketless connections the flood holds open at once (each re-opened when closed)."""


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("m") / MODEL
    make_synthetic_model(d, n_layers=4, hidden_size=256, intermediate_size=1024, seed=3)
    return d


@pytest.mark.unit
def test_listen_hosts_are_the_libp2p_addresses_never_the_wildcard() -> None:
    addrs = ["/ip4/127.0.0.1/tcp/5/p2p/x", "/ip4/10.0.0.2/tcp/5/p2p/x", "/ip6/::1/tcp/5", "/ip4/127.0.0.1/tcp/6"]
    assert listen_hosts(addrs) == ["127.0.0.1", "10.0.0.2"]
    assert listen_hosts(["/ip4/0.0.0.0/tcp/5"]) == ["127.0.0.1"] == listen_hosts([])


class FakeNet:
    """The two calls the bulk client makes on ``exo_p2p.net.Network``: tickets come from
    ``ticket()`` (raise in it to fail the request)."""

    def __init__(self, ticket) -> None:  # type: ignore[no-untyped-def]
        self.ticket = ticket

    def peer_addrs(self, peer: str) -> list[str]:
        return ["/ip4/127.0.0.1/tcp/1/p2p/x"]

    async def request(self, peer: str, protocol: str, data: bytes, *, timeout: float) -> bytes:
        return await self.ticket(peer, data)


def _p2p_from(model: Path, manifest: ModelManifest, used: list[int]):  # type: ignore[no-untyped-def]
    """A stand-in for the libp2p chunk getter: reads the chunk from ``model``, counts calls."""

    async def get(peer: str, path: str, index: int) -> bytes:
        used.append(index)
        start, end = chunk_span(manifest, path, index)
        with open(model / path, "rb") as f:
            f.seek(start)
            return f.read(end - start)

    return get


async def _fetch(model: Path, manifest: ModelManifest, net: FakeNet, root: Path, used: list[int]) -> float:
    """Fetch the whole model into ``root`` through ``fetch_getter``; seconds it took."""
    get, close = fetch_getter(net, manifest.digest, _p2p_from(model, manifest, used), timeout=10.0)
    wanted = shard_chunks(manifest, start_layer=0, end_layer=4, n_layers=4, tied=False)
    start = trio.current_time()
    try:
        with PartialModel(root, manifest) as partial:
            await fetch_chunks(partial, wanted, ["holder"], get)
            assert partial.complete
    finally:
        await close()
    return trio.current_time() - start


FLOODER = """
import sys, trio
port, n, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
async def client(i):
    while True:  # connect, send no token, connect again when the holder closes it
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
        except OSError:
            await trio.sleep(0.01)
            continue
        async with stream:
            try:
                if i % 2:  # half send one byte, which the kernel passes on (TCP_DEFER_ACCEPT)
                    await stream.send_all(b"x")
                while await stream.receive_some(1024):
                    pass
            except trio.BrokenResourceError:
                pass
async def main():
    with trio.move_on_after(seconds):
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(client, i)
trio.run(main)
"""
"""A process holding ``n`` ticketless connections to ``port`` (half silent, half after one
byte; each re-opened at once when closed) for at most ``seconds``."""


def test_a_flood_of_ticketless_connections_does_not_slow_a_real_fetch(tmp_path: Path, model: Path) -> None:
    """200 ticketless connections held open by another process (half silent, half after one
    byte; each re-opened at once when closed, for at most 20 s) while a fetch runs: every
    chunk still comes over the bulk path (no fall-back, no ticket holder closed), in at most
    2x the time the same fetch took alone (the flooding process shares the 2 cores) plus 2 s
    (each of the fetch's 2 connections may wait behind the flood in the accept queue:
    (200 - 64) x ``FULL_ACCEPT_PAUSE`` ~ 0.3 s; and a loaded machine)."""
    manifest = build_manifest(model, MODEL, chunk_bytes=64 * 1024)
    source = LocalModel(model, manifest)
    server = BulkServer(lambda d: source if d == manifest.digest else None)
    net = FakeNet(server.serve_ticket)
    used: list[int] = []
    times: dict[str, float] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.run, ["127.0.0.1"])
            times["alone"] = await _fetch(model, manifest, net, tmp_path / "alone", used)
            flooder = subprocess.Popen([sys.executable, "-c", FLOODER, str(port), str(FLOOD), "20"])
            try:
                with trio.fail_after(10):
                    while server.counts["evicted"] < FLOOD // 2:  # the flood is on: the waiting cap is full
                        await trio.sleep(0.05)
                with trio.fail_after(30):
                    times["flooded"] = await _fetch(model, manifest, net, tmp_path / "flooded", used)
            finally:
                flooder.terminate()
                flooder.wait(10)
            nursery.cancel_scope.cancel()

    trio.run(main)
    print(f"fetch of {manifest.total_bytes} bytes: alone {times['alone']:.2f} s, flooded "
          f"{times['flooded']:.2f} s; {server.counts}")
    assert used == [], f"{len(used)} chunks fell back to the libp2p stream under the flood"
    assert server.bytes_served == 2 * manifest.total_bytes
    assert server.counts["busy"] == 0
    assert times["flooded"] <= 2 * times["alone"] + 2.0, times


def _serve_badly(kind: str):  # type: ignore[no-untyped-def]
    """A holder's bulk port that fails in one way: ``closed`` after the token, ``garbage``
    (a reply longer than any chunk), ``silent`` (never answers)."""

    async def handler(stream: trio.SocketStream) -> None:
        async with stream:
            got = b""
            while len(got) < TOKEN_BYTES:
                part = await stream.receive_some(1024)
                if not part:
                    return
                got += part
            if kind == "garbage":
                await stream.receive_some(1024)
                await stream.send_all(_REPLY.pack(0, 1 << 40))
            if kind != "closed":
                await trio.sleep_forever()

    return handler


@pytest.mark.parametrize("fault", ["no_ticket", "refused", "closed", "garbage", "silent"])
def test_a_failing_bulk_path_falls_back_to_the_libp2p_stream(tmp_path: Path, model: Path, fault: str,
                                                           monkeypatch) -> None:
    """Whatever way the bulk path fails, the fetch completes over the libp2p getter and the
    log says it fell back (once for the holder)."""
    monkeypatch.setattr(bulk_client, "STALL_TIMEOUT", 0.5)
    manifest = build_manifest(model, MODEL, chunk_bytes=64 * 1024)
    used: list[int] = []
    n_chunks = sum(len(f.chunks) for f in manifest.files)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            if fault == "refused":  # a port nothing listens on any more
                with trio.socket.socket() as sock:
                    await sock.bind(("127.0.0.1", 0))
                    port = sock.getsockname()[1]
            else:
                listeners = await nursery.start(functools.partial(
                    trio.serve_tcp, _serve_badly(fault), 0, host="127.0.0.1"))
                port = listeners[0].socket.getsockname()[1]

            async def ticket(peer: str, data: bytes) -> bytes:
                if fault == "no_ticket":
                    raise RuntimeError("no such protocol")
                return msgspec.msgpack.encode(BulkTicket(port, bytes(TOKEN_BYTES)))

            with trio.fail_after(20):
                await _fetch(model, manifest, FakeNet(ticket), tmp_path / "c", used)
            nursery.cancel_scope.cancel()

    with structlog.testing.capture_logs() as logs:
        trio.run(main)
    assert len(used) == n_chunks  # every chunk over the libp2p getter
    fell_back = [e for e in logs if e["event"] == FELL_BACK]
    assert len(fell_back) == 1 and fell_back[0]["peer"] == "holder", logs


# --- two real nodes ------------------------------------------------------------------------------
def _libp2p_ips_and_ports(node: NodeProcess) -> tuple[set[str], set[int]]:
    """The addresses and ports of the node's libp2p listeners (from its advertised addrs)."""
    ips, ports = set(), set()
    for a in node.addrs():
        parts = a.split("/")
        ips.add(parts[2])
        ports.add(int(parts[4]))
    return ips, ports


def _bulk_listener(node: NodeProcess) -> tuple[int, set[str]]:
    """The bulk port and its bound addresses: the listener that is neither the API, libp2p nor
    the link probe listener."""
    _, libp2p_ports = _libp2p_ips_and_ports(node)
    assert wait_until(lambda: _probe_port(node) is not None, 30, what="the link probe listener")
    skip = {node.api_port, _probe_port(node), *libp2p_ports}
    others: dict[int, set[str]] = {}
    for c in psutil.Process(node.proc.pid).net_connections(kind="tcp"):
        if c.status == psutil.CONN_LISTEN and c.laddr.port not in skip:
            others.setdefault(c.laddr.port, set()).add(c.laddr.ip)
    assert len(others) == 1, f"expected one bulk listener, found {others}"
    return next(iter(others.items()))


@pytest.fixture(scope="module")
def closed_pair(tmp_path_factory, model: Path):  # type: ignore[no-untyped-def]
    """A (holding MODEL, libp2p on 0.0.0.0: every interface) and B, a closed 2-node cluster;
    yields (a, b, manifest) once B sees A's manifest."""
    base = tmp_path_factory.mktemp("pair")
    secret = make_secret(base / "secret")
    manifest = build_manifest(model, MODEL)
    with nodes_cleanup([]) as nodes:
        a = NodeProcess(base / "a", extra_args=["--models-dir", str(model.parent), "--cluster-secret", str(secret)])
        a.listen_host = "0.0.0.0"
        nodes.append(a.start())
        b = NodeProcess(base / "b", cluster=a.cluster, extra_args=[
            "--cluster-secret", str(secret), *[x for addr in a.addrs() for x in ("--bootstrap", addr)]])
        nodes.append(b.start())
        wait_until(lambda: converged([a, b], 2), 30, what="2-node cluster")
        a_id = self_id(a)

        def held() -> bool:
            profile = b.get("/state").json().get("nodes", {}).get(a_id) or {}
            return [MODEL, manifest.digest, True] in (profile.get("held_models") or [])

        wait_until(held, 30, what="A's manifest in B's State")
        yield a, b, manifest


def test_the_bulk_listener_binds_only_where_libp2p_listens(closed_pair) -> None:
    """A node listening for libp2p on 0.0.0.0 (each concrete interface) binds its bulk port on
    exactly those addresses: never the IPv4 or IPv6 wildcard."""
    a, _, _ = closed_pair
    ips, _ = _libp2p_ips_and_ports(a)
    port, bound = _bulk_listener(a)
    print(f"libp2p on {sorted(ips)}; bulk port {port} on {sorted(bound)}")
    assert bound == ips, f"bulk port {port} bound on {bound}, libp2p listens on {ips}"
    assert not bound & {"0.0.0.0", "::"}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (iptables)")
def test_a_pull_whose_bulk_port_is_blocked_completes_over_libp2p(closed_pair) -> None:
    """A's bulk port refuses every connection (iptables REJECT with a TCP reset): B's pull of
    A's model still completes, every byte from A, and B's log says it fell back."""
    assert shutil.which("iptables"), "iptables missing: run scripts/install.sh --test as root"
    a, b, manifest = closed_pair
    port, _ = _bulk_listener(a)
    rule = ["INPUT", "-p", "tcp", "--dport", str(port), "-j", "REJECT", "--reject-with", "tcp-reset"]
    subprocess.run(["iptables", "-I", *rule], check=True, capture_output=True, timeout=5)
    try:
        start = time.monotonic()
        assert b.post("/models/pull", json={"model": MODEL}).status_code == 201

        def finished() -> dict | None:
            status = {p["model"]: p for p in b.get("/models/pulls").json()}.get(MODEL)
            return status if status and status["state"] != "running" else None

        status = wait_until(finished, 60, what="pull finished")
        print(f"pull over libp2p with the bulk port blocked: {time.monotonic() - start:.1f} s")
    finally:
        subprocess.run(["iptables", "-D", *rule], capture_output=True, timeout=5)
    assert status["state"] == "done", status
    assert status["bytes_by_peer"] == {self_id(a): manifest.total_bytes}
    assert FELL_BACK in b.log_path.read_text()
