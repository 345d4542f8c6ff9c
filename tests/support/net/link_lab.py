"""Network namespaces joined by links of chosen speed, for the link tests (root; docs/links.md).

``LinkLab(n, links)``: namespace i per node; each entry ``(i, j, kind)`` of ``links`` is one
link between namespaces i and j with subnets of its own:

- ``"fast"``: a veth pair straight between i and j (i is ``.1``, j is ``.2``);
- ``"slow"``: through a router namespace: i ↔ router ↔ j, the router's ends shaped with
  ``tbf`` (``rate``) and every TCP connection crossing it redirected to a user-space relay
  that delays each direction by ``delay`` s (``tests/support/net/delay_relay.py``; the kernel has no
  ``netem``). i is ``.1`` of the lower half of the subnet, j ``.129`` of the upper.

The test reaches each node's API over a management bridge (``mgmt_ip(i)``, host
``mgmt_host``); each namespace refuses (TCP reset) traffic to the other namespaces on it, so
the nodes only ever talk over the lab's links. ``down(k)`` / ``up(k)`` set link k's ends in
its namespaces down / up. ``close()`` stops the relays and deletes everything (idempotent).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

from tests.support.cluster import run_ip

RELAY_PORT = 18999
RELAY = Path(__file__).with_name("delay_relay.py")


def _sh(*args: str, check: bool = True) -> None:
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=10)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {r.stderr.strip()}")


class LinkLab:
    def __init__(self, n: int, links: list[tuple[int, int, str]], *, rate: str = "20mbit", delay: float = 0.01) -> None:
        self.n, self.links, self.rate, self.delay = n, links, rate, delay
        self.tag = f"{os.getpid() % 1000:03d}{random.randrange(36**3):03x}"[:6]
        self.namespaces = [f"ln{self.tag}{i}" for i in range(n)]
        self.routers: list[str] = []
        self.relays: list[subprocess.Popen] = []
        self.ends: list[list[tuple[str, str]]] = []  # per link: (namespace, device) of each end
        self.addresses: list[tuple[str, str]] = []  # per link: (i's address, j's address)
        self.bridge = f"lb{self.tag}"
        self.mgmt_subnet = self._free_subnet()
        self._made: list[tuple[str, ...]] = []

    @staticmethod
    def _free_subnet() -> str:
        used = run_ip("-4", "addr").stdout + run_ip("-4", "route").stdout
        for _ in range(500):
            candidate = f"10.{random.randrange(100, 250)}.{random.randrange(1, 250)}"
            if f" {candidate}." not in used and f"{candidate}.0/" not in used:
                return candidate
        raise RuntimeError("no free 10.x.y.0/24 subnet")

    @property
    def mgmt_host(self) -> str:
        return f"{self.mgmt_subnet}.254"

    def mgmt_ip(self, i: int) -> str:
        return f"{self.mgmt_subnet}.{i + 1}"

    def open(self) -> "LinkLab":
        try:
            self._open()
        except Exception:
            self.close()
            raise
        return self

    def _open(self) -> None:
        run_ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(("link", self.bridge))
        run_ip("addr", "add", f"{self.mgmt_host}/24", "dev", self.bridge)
        run_ip("link", "set", self.bridge, "up")
        for i, ns in enumerate(self.namespaces):
            run_ip("netns", "add", ns)
            self._made.append(("netns", ns))
            host_end, ns_end = f"lh{self.tag}{i}", f"lm{self.tag}{i}"
            run_ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
            self._made.append(("link", host_end))
            run_ip("link", "set", ns_end, "netns", ns)
            run_ip("link", "set", host_end, "master", self.bridge)
            run_ip("link", "set", host_end, "up")
            run_ip("-n", ns, "addr", "add", f"{self.mgmt_ip(i)}/24", "dev", ns_end)
            run_ip("-n", ns, "link", "set", ns_end, "up")
            run_ip("-n", ns, "link", "set", "lo", "up")
            # the management bridge reaches the host only: nodes must talk over the lab's links
            _sh("ip", "netns", "exec", ns, "iptables", "-A", "OUTPUT", "-o", ns_end, "!", "-d", self.mgmt_host,
                "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset")
        for k, (i, j, kind) in enumerate(self.links):
            subnet = self._free_subnet()
            if kind == "fast":
                self._fast(k, i, j, subnet)
            else:
                self._slow(k, i, j, subnet)

    def _fast(self, k: int, i: int, j: int, subnet: str) -> None:
        a, b = f"lf{self.tag}{k}a", f"lf{self.tag}{k}b"
        run_ip("link", "add", a, "netns", self.namespaces[i], "type", "veth", "peer", "name", b, "netns", self.namespaces[j])
        for ns, dev, ip in ((self.namespaces[i], a, f"{subnet}.1"), (self.namespaces[j], b, f"{subnet}.2")):
            run_ip("-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            run_ip("-n", ns, "link", "set", dev, "up")
        self.ends.append([(self.namespaces[i], a), (self.namespaces[j], b)])
        self.addresses.append((f"{subnet}.1", f"{subnet}.2"))

    def _slow(self, k: int, i: int, j: int, subnet: str) -> None:
        router = f"lr{self.tag}{k}"
        run_ip("netns", "add", router)
        self._made.append(("netns", router))
        self.routers.append(router)
        run_ip("-n", router, "link", "set", "lo", "up")
        ends = []
        for side, (node, mine, theirs, other) in enumerate(((i, 1, 126, 128), (j, 129, 254, 0))):
            a, r = f"ls{self.tag}{k}{side}", f"lt{self.tag}{k}{side}"
            ns = self.namespaces[node]
            run_ip("link", "add", a, "netns", ns, "type", "veth", "peer", "name", r, "netns", router)
            run_ip("-n", ns, "addr", "add", f"{subnet}.{mine}/25", "dev", a)
            run_ip("-n", router, "addr", "add", f"{subnet}.{theirs}/25", "dev", r)
            run_ip("-n", ns, "link", "set", a, "up")
            run_ip("-n", router, "link", "set", r, "up")
            run_ip("-n", ns, "route", "add", f"{subnet}.{other}/25", "via", f"{subnet}.{theirs}")
            _sh("ip", "netns", "exec", router, "tc", "qdisc", "add", "dev", r, "root", "tbf",
                "rate", self.rate, "burst", "32kbit", "latency", "400ms")
            ends.append((ns, a))
        _sh("ip", "netns", "exec", router, "iptables", "-t", "nat", "-A", "PREROUTING", "-p", "tcp",
            "-j", "REDIRECT", "--to-ports", str(RELAY_PORT))
        relay = subprocess.Popen(["ip", "netns", "exec", router, sys.executable, str(RELAY), "--port", str(RELAY_PORT),
                                  "--delay", str(self.delay)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.relays.append(relay)
        assert relay.stdout is not None and relay.stdout.readline().strip() == "relay ready"
        self.ends.append(ends)
        self.addresses.append((f"{subnet}.1", f"{subnet}.129"))

    def down(self, k: int) -> None:
        for ns, dev in self.ends[k]:
            run_ip("-n", ns, "link", "set", dev, "down")

    def up(self, k: int) -> None:
        for ns, dev in self.ends[k]:
            run_ip("-n", ns, "link", "set", dev, "up")

    def close(self) -> None:
        for relay in self.relays:
            relay.terminate()
            try:
                relay.wait(5)
            except subprocess.TimeoutExpired:
                relay.kill()
                relay.wait(5)
        self.relays.clear()
        for kind, name in reversed(self._made):
            if kind == "netns":
                run_ip("netns", "del", name, check=False)
            else:
                run_ip("link", "del", name, check=False)
        self._made.clear()

    def __enter__(self) -> "LinkLab":
        return self.open()

    def __exit__(self, *exc) -> None:  # type: ignore[no-untyped-def]
        self.close()
