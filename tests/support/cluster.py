"""Test harness: real ``exo-p2p node`` processes on 127.0.0.1 with their own ports and data
dirs, cleaned up (node and runner processes) however the test ends."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[2]


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ephemeral ports (outgoing connections' local ports, port 0)."""
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _worker_slice(low: int, top: int) -> tuple[int, int]:
    """This pytest-xdist worker's own part of ``[low, top)``: workers draw from disjoint
    slices, so a port one worker picked and has not bound yet (a rank process still importing
    MLX) is never picked and bound by another worker meanwhile (that race failed a ring init
    with "Couldn't bind socket (error: 98)"). The whole range outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or not worker[2:].isdigit() or count <= 1:
        return low, top
    index = int(worker[2:]) % count
    width = (top - low) // count
    return low + index * width, low + (index + 1) * width


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports on 127.0.0.1 for listeners started later (node APIs, libp2p
    hosts, MLX ring ranks), outside the ephemeral range: a port the kernel handed out for
    ``bind(0)`` can be taken, before the listener binds it, as the local port of any outgoing
    connection on the machine (then the node's start fails with "port … is in use"). Ports below the range are never given out implicitly; picked at random among
    them, below the ring ports placement hands out (``master.placement.ring.RING_BASE_PORT`` and
    up), and checked free by binding. Falls back to ``bind(0)`` when the range leaves too
    little room below it."""
    from master.placement.ring import RING_BASE_PORT

    low, top = _worker_slice(10000, min(_ephemeral_range()[0], RING_BASE_PORT))
    ports: list[int] = []
    for _ in range(50 * n if top - low > 1000 else 0):
        if len(ports) == n:
            return ports
        port = random.randrange(low, top)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if port not in ports:
            ports.append(port)
    socks = []
    try:
        while len(ports) < n:
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
            if (port := s.getsockname()[1]) not in ports:
                ports.append(port)
    finally:
        for s in socks:
            s.close()
    return ports


def free_port() -> int:
    """One port as :func:`free_ports` picks them."""
    return free_ports(1)[0]


class NodeProcess:
    """One node process. ``start()`` returns once its API answers (bounded by ``timeout``)."""

    def __init__(
        self,
        data_dir: Path,
        *,
        extra_args: list[str] | None = None,
        env: dict | None = None,
        cluster: str | None = None,
        mdns: bool = False,
        api_key: str | None = None,
    ) -> None:
        """A node in its own cluster (``cluster`` name, random by default) so parallel and
        sequential tests never meet; mDNS off unless asked (tests join by bootstrap). With
        ``api_key`` the node requires it and ``get``/``post`` send it."""
        self.data_dir = data_dir
        self.cluster = cluster or f"test-{os.getpid()}-{id(self):x}"
        self.mdns = mdns
        self.api_port = free_port()
        self.extra_args = list(extra_args or []) + (["--api-key", api_key] if api_key else [])
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        # test nodes share this machine's few cores (several nodes, their runners and the
        # test process): one BLAS thread per runner, unless the test or the environment says
        # the machine's Ollama and LM Studio models stay out (a test gives --ollama-models /
        # --lmstudio-models, which win over these variables)
        stores = {"EXO_P2P_OLLAMA_MODELS": str(data_dir / "no-ollama"), "EXO_P2P_LMSTUDIO_MODELS": str(data_dir / "no-lmstudio"),
                  # and so does its Hugging Face cache: a node lists it, and a hub pull lands in it
                  "HF_HOME": str(data_dir / "hf-home")}
        self.env = {"OPENBLAS_NUM_THREADS": "1", **os.environ, "HF_HUB_OFFLINE": "1", **stores, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.log_path = data_dir / "node.log"
        self._known_children: set[int] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    listen_host = "127.0.0.1"
    """Where libp2p listens (``--listen-host``)."""
    api_host: str | None = None
    """Where the API listens (``--api-host``); None: the node's default, 127.0.0.1."""
    calibrate = False
    """Whether the node measures its speed (``--no-calibrate`` unless set): a test node's ~1.5 s
    of CPU at start, on a machine that starts hundreds of them, buys nothing but for the tests
    of the speed-aware split (``tests.support.speed_nodes``), which set it."""

    def command(self) -> list[str]:
        """The node's command line."""
        return [
            sys.executable, "-m", "exo_p2p", "node",
            "--data-dir", str(self.data_dir),
            *([] if self.api_host is None else ["--api-host", self.api_host]),
            "--api-port", str(self.api_port),
            "--listen-host", self.listen_host,
            "--listen-port", "0",
            "--log-format", "json",
            "--cluster", self.cluster,
            *([] if self.mdns else ["--no-mdns"]),
            *([] if self.calibrate else ["--no-calibrate"]),
            *self.extra_args,
        ]

    def spawn(self) -> None:
        """Start the node's process, its output appended to ``log_path``; returns at once."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=REPO)

    def start(self, timeout: float = 60.0, retries_left: int = 2) -> "NodeProcess":
        """Spawn the node and wait until its API answers ``/health``. A node whose API port was
        taken since it was picked is started again on another (at most ``retries_left`` times).
        Raises RuntimeError if the process exits, TimeoutError after ``timeout`` seconds."""
        self.spawn()
        where = f"port {self.api_port} on {self.api_host or '127.0.0.1'} is"
        # the node's start-up check ("… is not available (…)") or its API bind ("… is in use")
        port_taken = (f"{where} not available", f"{where} in use")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if retries_left > 0 and any(t in self.log_tail(5) for t in port_taken):
                    self.api_port = free_port()  # taken since it was picked: another one, bounded
                    return self.start(timeout=max(1.0, deadline - time.monotonic()), retries_left=retries_left - 1)
                raise RuntimeError(f"node exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"node API did not answer within {timeout} s:\n{self.log_tail()}")

    def addrs(self) -> list[str]:
        """This node's dialable multiaddrs (from ``GET /nodes``)."""
        for n in self.get("/nodes").json():
            if n["is_self"]:
                return n["addrs"]
        return []

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def children(self) -> list[psutil.Process]:
        """Live child processes (runners) of the node."""
        if self.proc is None:
            return []
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        self._known_children.update(k.pid for k in kids)
        return kids

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, wait, then SIGKILL; also kills any runner left behind. Returns the exit code."""
        if self.proc is None:
            return None
        self.children()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._reap_children()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the node process only (not its runners)."""
        if self.proc is not None and self.proc.poll() is None:
            self.children()
            self.proc.kill()
            self.proc.wait(5)

    def _reap_children(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        for pid in list(self._known_children):
            try:
                p = psutil.Process(pid)
                p.wait(max(0.1, deadline - time.monotonic()))
            except psutil.NoSuchProcess:
                continue
            except psutil.TimeoutExpired:
                p.kill()

    # --- API helpers ----------------------------------------------------------------------
    def get(self, path: str, **kw) -> httpx.Response:
        return httpx.get(self.url + path, timeout=kw.pop("timeout", 30), headers={**self.headers, **kw.pop("headers", {})}, **kw)

    def post(self, path: str, json=None, **kw) -> httpx.Response:
        return httpx.post(self.url + path, json=json, timeout=kw.pop("timeout", 120), headers={**self.headers, **kw.pop("headers", {})}, **kw)

    def place_and_wait(self, model: str, timeout: float = 180.0, **body) -> dict:
        r = self.post("/instances", json={"model": model, **body})
        assert r.status_code == 201, r.text
        instance = r.json()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.get(f"/instances/{instance['instance_id']}")
            assert r.status_code == 200, f"instance {instance['instance_id']}: {r.status_code} {r.text}\n{self.log_tail()}"
            view = r.json()
            if view["status"] == "ready":
                return view
            assert view["status"] != "failed", view
            time.sleep(0.3)
        raise TimeoutError(f"instance not ready within {timeout} s:\n{self.log_tail()}")

    def chat(self, content: str, model: str, timeout: float = 300, **params) -> httpx.Response:
        """POST one user message to ``/v1/chat/completions``; ``params`` go into the body,
        ``timeout`` (seconds) is the client's, not the request's."""
        body = {"model": model, "messages": [{"role": "user", "content": content}], **params}
        return self.post("/v1/chat/completions", json=body, timeout=timeout)


def wait_until(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    """Poll ``predicate()`` until it returns a truthy value (returned) or ``timeout`` s pass."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            last_exc = exc
        time.sleep(interval)
    raise TimeoutError(f"{what} not reached within {timeout} s (last error: {last_exc!r})")


def states(nodes: list[NodeProcess]) -> list[dict]:
    return [n.get("/state", timeout=5).json() for n in nodes]


def converged(nodes: list[NodeProcess], n_nodes: int | None = None) -> bool:
    """Same master, same last index, same State hash on every node (and ``n_nodes`` nodes
    in State when given)."""
    ss = states(nodes)
    if any(s["master"] is None for s in ss):
        return False
    keys = {(s["master"], s["last_event_idx"], s["state_hash"]) for s in ss}
    if len(keys) != 1:
        return False
    return n_nodes is None or all(len(s["nodes"]) == n_nodes and full_mesh(s) for s in ss)


def full_mesh(state: dict) -> bool:
    """True when ``state`` (a ``GET /state`` dict) holds a topology edge for every ordered pair
    of its nodes: what placement needs before any subset of them can form a cycle. Node counts
    alone are not enough: a follower learns of another follower's edge a moment after both
    joined (a placement on two followers in that moment gets "no candidate cycle")."""
    nodes = list(state["nodes"])
    edges = state.get("edges", {})
    return all(b in edges.get(a, {}) for a in nodes for b in nodes if a != b)


class Cluster:
    """Several nodes joined by bootstrap addresses (the first node's), in one test cluster."""

    def __init__(self, base: Path, n: int, *, extra_args: list[str] | None = None) -> None:
        self.base = base
        self.name = f"test-{os.getpid()}-{id(self):x}"
        self.extra_args = list(extra_args or [])
        self.nodes: list[NodeProcess] = []
        self.n = n

    def start(self, timeout: float = 60.0) -> "Cluster":
        first = NodeProcess(self.base / "node0", cluster=self.name, extra_args=self.extra_args).start(timeout)
        self.nodes.append(first)
        boot = first.addrs()
        for i in range(1, self.n):
            self.add(f"node{i}", bootstrap=boot, timeout=timeout)
        wait_until(lambda: converged(self.nodes, self.n), 30, what="cluster convergence")
        return self

    def add(self, name: str, *, bootstrap: list[str], timeout: float = 60.0, extra: list[str] | None = None) -> NodeProcess:
        args = [*self.extra_args, *(extra or [])]
        for a in bootstrap:
            args += ["--bootstrap", a]
        node = NodeProcess(self.base / name, cluster=self.name, extra_args=args).start(timeout)
        self.nodes.append(node)
        return node

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


# --- additions for the security / churn / namespace tests and the cluster bench -----------------
# (additive: nothing above changes behaviour)

SELF_LISTED = 30.0
"""Seconds a started node may take to list itself in ``GET /nodes``: a node that joins a
cluster is listed once the master has sequenced its join and the node has applied it (well
under a second on a quiet machine; generous for a loaded one, where a wait that ran out is
a join that never happened)."""


def self_id(node: NodeProcess) -> str:
    """The node id of ``node`` (its own entry in ``GET /nodes``, waited for up to
    ``SELF_LISTED`` s: ``/nodes`` is the cluster's State, which lists a joining node only
    after its join was applied). Raises ``TimeoutError`` when it never appears."""

    def own() -> str | None:
        return next((n["node_id"] for n in node.get("/nodes", timeout=5).json() if n["is_self"]), None)

    return wait_until(own, SELF_LISTED, what=f"{node.data_dir.name}'s own entry in /nodes")


def state_of(node: NodeProcess, timeout: float = 5.0) -> dict | None:
    """``GET /state`` as a dict, or None when the node does not answer."""
    try:
        r = node.get("/state", timeout=timeout)
        return r.json() if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


def agreement(nodes: list[NodeProcess], n_nodes: int | None = None) -> tuple | None:
    """``(master, term, last_event_idx, state_hash)`` when every node reports the same
    values (and, when ``n_nodes`` is given, ``n_nodes`` nodes in State joined by a full mesh
    of edges), else None."""
    ss = [state_of(n) for n in nodes]
    if any(s is None or s["master"] is None for s in ss):
        return None
    keys = {(s["master"], s["term"], s["last_event_idx"], s["state_hash"]) for s in ss}
    if len(keys) != 1:
        return None
    if n_nodes is not None and any(len(s["nodes"]) != n_nodes or not full_mesh(s) for s in ss):
        return None
    return keys.pop()


def make_secret(path: Path) -> Path:
    """A new cluster secret in ``path`` made by ``exo-p2p cluster-secret FILE``."""
    r = subprocess.run([sys.executable, "-m", "exo_p2p", "cluster-secret", str(path)], capture_output=True, text=True, timeout=60, cwd=REPO)
    if r.returncode != 0:
        raise RuntimeError(f"cluster-secret failed: {r.stdout}{r.stderr}")
    return path


def run_ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``ip ARGS`` (root); raises on failure when ``check``."""
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {r.stderr.strip()}")
    return r


class NetnsLan:
    """A LAN of ``n`` network namespaces on one Linux bridge (root needed), for tests that
    need multicast (mDNS) or a link to cut. Namespace i has ``lan_ip(i)`` on its veth; the
    host has ``host_ip`` on the bridge so the test reaches the nodes' APIs. Names and the
    /24 subnet are unique per instance; ``close()`` deletes everything (idempotent).

    ``cut(i)`` / ``heal(i)`` set the host end of namespace i's veth down / up (a partition:
    the namespace keeps its address, packets stop flowing)."""

    def __init__(self, n: int, *, multicast: bool = True, mgmt: bool = False) -> None:
        self.n = n
        self.tag = f"{os.getpid() % 1000:03d}{random.randrange(36**3):03x}"[:6]
        self.bridge = f"xb{self.tag}"
        self.namespaces = [f"xn{self.tag}{i}" for i in range(n)]
        self.host_ends = [f"xh{self.tag}{i}" for i in range(n)]
        self.ns_ends = [f"xv{self.tag}{i}" for i in range(n)]
        self.subnet = self._free_subnet()
        self.host_ip = f"{self.subnet}.254"
        self.multicast = multicast
        self.mgmt = mgmt
        self.mgmt_bridge = f"xm{self.tag}"
        self.mgmt_subnet = self._free_subnet() if mgmt else ""
        self._created_ns: list[str] = []
        self._bridge_made = False
        self._mgmt_made = False

    @staticmethod
    def _free_subnet() -> str:
        used = run_ip("-4", "addr").stdout
        for _ in range(200):
            candidate = f"10.{random.randrange(100, 250)}.{random.randrange(1, 250)}"
            if f" {candidate}." not in used:
                return candidate
        raise RuntimeError("no free 10.x.y.0/24 subnet")

    def lan_ip(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def mgmt_ip(self, i: int) -> str:
        """Namespace i's address on the management bridge (``mgmt=True``): a second link the
        test reaches APIs by, which ``cut`` leaves up."""
        return f"{self.mgmt_subnet}.{i + 1}"

    def open(self) -> "NetnsLan":
        try:
            run_ip("link", "add", self.bridge, "type", "bridge")
            self._bridge_made = True
            run_ip("addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
            run_ip("link", "set", self.bridge, "up")
            for i, ns in enumerate(self.namespaces):
                run_ip("netns", "add", ns)
                self._created_ns.append(ns)
                run_ip("link", "add", self.host_ends[i], "type", "veth", "peer", "name", self.ns_ends[i])
                run_ip("link", "set", self.ns_ends[i], "netns", ns)
                run_ip("link", "set", self.host_ends[i], "master", self.bridge)
                run_ip("link", "set", self.host_ends[i], "up")
                run_ip("-n", ns, "addr", "add", f"{self.lan_ip(i)}/24", "dev", self.ns_ends[i])
                run_ip("-n", ns, "link", "set", self.ns_ends[i], "up")
                run_ip("-n", ns, "link", "set", "lo", "up")
                if self.multicast:
                    run_ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", self.ns_ends[i])
            if self.mgmt:
                run_ip("link", "add", self.mgmt_bridge, "type", "bridge")
                self._mgmt_made = True
                run_ip("addr", "add", f"{self.mgmt_subnet}.254/24", "dev", self.mgmt_bridge)
                run_ip("link", "set", self.mgmt_bridge, "up")
                for i, ns in enumerate(self.namespaces):
                    host_end, ns_end = f"xg{self.tag}{i}", f"xa{self.tag}{i}"
                    run_ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
                    run_ip("link", "set", ns_end, "netns", ns)
                    run_ip("link", "set", host_end, "master", self.mgmt_bridge)
                    run_ip("link", "set", host_end, "up")
                    run_ip("-n", ns, "addr", "add", f"{self.mgmt_ip(i)}/24", "dev", ns_end)
                    run_ip("-n", ns, "link", "set", ns_end, "up")
        except Exception:
            self.close()
            raise
        return self

    def cut(self, i: int) -> None:
        run_ip("link", "set", self.host_ends[i], "down")

    def heal(self, i: int) -> None:
        run_ip("link", "set", self.host_ends[i], "up")

    def close(self) -> None:
        for i, ns in enumerate(list(self._created_ns)):
            run_ip("link", "del", self.host_ends[i], check=False)
            run_ip("link", "del", f"xg{self.tag}{i}", check=False)
            run_ip("netns", "del", ns, check=False)
            self._created_ns.remove(ns)
        if self._mgmt_made:
            run_ip("link", "del", self.mgmt_bridge, check=False)
            self._mgmt_made = False
        if self._bridge_made:
            run_ip("link", "del", self.bridge, check=False)
            self._bridge_made = False

    def __enter__(self) -> "NetnsLan":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()


class NetnsNodeProcess(NodeProcess):
    """A node run inside network namespace ``netns`` (``ip netns exec``): libp2p listens on
    ``listen_host`` (the namespace's LAN address), the API on ``api_host`` (0.0.0.0 by
    default) and the test reaches it at ``http://<listen_host>:<api_port>`` over the bridge.
    ``ip netns exec`` execs the node, so ``proc.pid`` is the node's pid."""

    def __init__(self, data_dir: Path, *, netns: str, listen_host: str, api_host: str = "0.0.0.0", **kw) -> None:
        super().__init__(data_dir, **kw)
        self.netns = netns
        self.listen_host = listen_host
        self.api_host = api_host

    @property
    def url(self) -> str:
        host = self.listen_host if self.api_host == "0.0.0.0" else self.api_host
        return f"http://{host}:{self.api_port}"

    def command(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *super().command()]


def start_all(nodes: list[NodeProcess], timeout: float = 60.0) -> float:
    """Start every node's process at once, wait until each API answers; returns the
    ``time.monotonic()`` at which the last API answered. Raises like ``NodeProcess.start``."""
    for node in nodes:
        node.spawn()
    deadline = time.monotonic() + timeout
    waiting = list(nodes)
    last = time.monotonic()
    while waiting and time.monotonic() < deadline:
        for node in list(waiting):
            if node.proc.poll() is not None:
                raise RuntimeError(f"node exited with {node.proc.returncode}:\n{node.log_tail()}")
            try:
                if httpx.get(f"{node.url}/health", timeout=2).status_code == 200:
                    waiting.remove(node)
                    last = time.monotonic()
            except httpx.HTTPError:
                pass
        time.sleep(0.05)
    if waiting:
        raise TimeoutError(f"{len(waiting)} node APIs did not answer within {timeout} s:\n{waiting[0].log_tail()}")
    return last


def libp2p_port(node: NodeProcess) -> int:
    """The TCP port ``node`` listens on for libp2p (from its advertised addresses)."""
    for a in node.addrs():
        parts = a.split("/")
        if "tcp" in parts:
            return int(parts[parts.index("tcp") + 1])
    raise RuntimeError("node lists no tcp address")


def kill_peer_connections(node: NodeProcess, listen_port: int) -> int:
    """Abort (``ss -K``, root) every established libp2p TCP connection of ``node``'s process:
    those accepted on ``listen_port`` and those it dialled (its API connections are kept).
    Both ends get a reset, like a cable pulled and re-plugged. Returns how many were found."""
    assert node.proc is not None
    try:
        conns = psutil.Process(node.proc.pid).net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return 0
    found = 0
    for c in conns:
        if c.status != psutil.CONN_ESTABLISHED or not c.raddr:
            continue
        if c.laddr.port == node.api_port:
            continue
        found += 1
        for a, b in ((c.laddr.port, c.raddr.port), (c.raddr.port, c.laddr.port)):
            subprocess.run(["ss", "-K", "sport", "=", f":{a}", "dport", "=", f":{b}"], capture_output=True, timeout=5)
    return found


@contextlib.contextmanager
def nodes_cleanup(nodes: list[NodeProcess]):
    """Stop every node in ``nodes`` (the list may grow inside the block) however it ends."""
    try:
        yield nodes
    finally:
        for n in nodes:
            try:
                if n.proc is not None and n.proc.poll() is None:
                    try:
                        os.kill(n.proc.pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
                n.stop()
            except Exception:  # noqa: BLE001 - keep stopping the others
                if n.proc is not None and n.proc.poll() is None:
                    n.proc.kill()


def stream_in_background(node: NodeProcess, model: str, max_tokens: int = 2000, temperature: float | None = None):
    """Start a long streaming chat on ``node`` in a thread; returns ``(thread, result)`` where
    ``result`` holds the SSE ``lines`` (a transport error appended as a line), ``status``,
    ``first_at`` (first content) and ``ended_at`` (monotonic seconds). ``temperature`` 0: a
    greedy generation, which on the tiny model never samples its end token early."""
    import threading

    result: dict = {"lines": [], "first_at": None, "ended_at": None, "status": None}

    def go() -> None:
        body = {"model": model, "messages": [{"role": "user", "content": "go on forever"}], "max_tokens": max_tokens, "stream": True}
        if temperature is not None:
            body["temperature"] = temperature
        try:
            with httpx.stream("POST", node.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(120, connect=10)) as r:
                result["status"] = r.status_code
                for line in r.iter_lines():
                    if line:
                        result["lines"].append(line)
                        if result["first_at"] is None and '"content"' in line:
                            result["first_at"] = time.monotonic()
        except httpx.HTTPError as exc:
            result["lines"].append(f"transport error: {exc!r}")
        result["ended_at"] = time.monotonic()

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread, result
