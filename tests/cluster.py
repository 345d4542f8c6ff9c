"""Test harness: real ``exo-p2p node`` processes on 127.0.0.1 with their own ports and data
dirs, cleaned up (node and runner processes) however the test ends."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    ) -> None:
        """A node in its own cluster (``cluster`` name, random by default) so parallel and
        sequential tests never meet; mDNS off unless asked (tests join by bootstrap)."""
        self.data_dir = data_dir
        self.cluster = cluster or f"test-{os.getpid()}-{id(self):x}"
        self.mdns = mdns
        self.api_port = free_port()
        self.extra_args = list(extra_args or [])
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.log_path = data_dir / "node.log"
        self._known_children: set[int] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def start(self, timeout: float = 60.0) -> "NodeProcess":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        cmd = [
            sys.executable, "-m", "exo_p2p", "node",
            "--data-dir", str(self.data_dir),
            "--api-port", str(self.api_port),
            "--listen-host", "127.0.0.1",
            "--listen-port", "0",
            "--log-format", "json",
            "--cluster", self.cluster,
            *([] if self.mdns else ["--no-mdns"]),
            *self.extra_args,
        ]
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=REPO)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/state", timeout=2).status_code == 200:
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
        return httpx.get(self.url + path, timeout=kw.pop("timeout", 30), **kw)

    def post(self, path: str, json=None, **kw) -> httpx.Response:
        return httpx.post(self.url + path, json=json, timeout=kw.pop("timeout", 120), **kw)

    def place_and_wait(self, model: str, timeout: float = 180.0, **body) -> dict:
        r = self.post("/instances", json={"model": model, **body})
        assert r.status_code == 201, r.text
        instance = r.json()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            view = self.get(f"/instances/{instance['instance_id']}").json()
            if view["status"] == "ready":
                return view
            assert view["status"] != "failed", view
            time.sleep(0.3)
        raise TimeoutError(f"instance not ready within {timeout} s:\n{self.log_tail()}")

    def chat(self, content: str, model: str, **params) -> httpx.Response:
        body = {"model": model, "messages": [{"role": "user", "content": content}], **params}
        return self.post("/v1/chat/completions", json=body, timeout=params.pop("timeout", 300) if "timeout" in params else 300)


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
    return n_nodes is None or all(len(s["nodes"]) == n_nodes for s in ss)


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
