"""Churn, quick master restart and duplicate identity with real node processes on 127.0.0.1.

Churn: node C's libp2p TCP connections are aborted every 0.3 s for ~30 s
(``ss -K`` on both ends, root: a real disconnect, each time followed by C's re-dial) while
chat requests through the master's API keep the master sequencing ~10 events/s (each chat
to a 1-node synthetic-model instance on node B is a command plus runner/task events from
B's worker). Afterwards every node still answers, heartbeats and converges, and the drop
counters in ``/state`` are consistent.
"""

from __future__ import annotations

import shutil
import threading
import time

import httpx
import pytest

from tests.conftest import NEW_MASTER, tiny_models_dir
from tests.support.cluster import (
    Cluster,
    NodeProcess,
    agreement,
    kill_peer_connections,
    libp2p_port,
    nodes_cleanup,
    self_id,
    state_of,
    wait_until,
)

pytestmark = pytest.mark.integration

MODEL = "tiny"
SLACK = 3.0  # over a product bound: load on a shared 2-core machine


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tiny_models_dir(tmp_path_factory, n_layers=2, seed=3)


def by_id(nodes: list[NodeProcess]) -> dict[str, NodeProcess]:
    return {self_id(n): n for n in nodes}


class ChatLoad:
    """Chat requests at ``rate``/s through ``node`` in a thread; records status codes."""

    def __init__(self, node: NodeProcess, rate: float) -> None:
        self.node, self.rate = node, rate
        self.codes: list[int] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                t = time.monotonic()
                try:
                    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
                    self.codes.append(client.post(self.node.url + "/v1/chat/completions", json=body).status_code)
                except httpx.HTTPError as exc:
                    self.errors.append(repr(exc))
                self._stop.wait(max(0.0, 1 / self.rate - (time.monotonic() - t)))

    def __enter__(self) -> "ChatLoad":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)


def test_churn_one_node_while_the_master_sequences(tmp_path, models_dir):
    if shutil.which("ss") is None:
        pytest.skip("needs ss -K to abort connections")
    cluster = Cluster(tmp_path, 3, extra_args=["--models-dir", str(models_dir)])
    with nodes_cleanup(cluster.nodes):
        cluster.start()
        ids = by_id(cluster.nodes)
        # a node that just joined may drop its master for one election tick (~0.1 s, seen in
        # 3 of 6 and 6 of 8 three-node starts; not fixed yet): wait for one agreed view, bounded
        master_id = wait_until(lambda: agreement(cluster.nodes), 10, interval=0.1, what="agreement after start")[0]
        master = ids[master_id]
        others = [n for i, n in ids.items() if i != master_id]
        host, churner = others  # B hosts the instance, C churns
        r = master.post("/instances", json={"model": MODEL, "nodes": [self_id(host)]})
        assert r.status_code == 201, r.text
        instance_id = r.json()["instance_id"]
        wait_until(lambda: master.get(f"/instances/{instance_id}").json()["status"] == "ready", 90, what="instance ready")
        idx0 = state_of(master)["last_event_idx"]
        churn_port = libp2p_port(churner)
        pid_before = {n: n.proc.pid for n in cluster.nodes}

        # the rate the master sequences this load at without churn, on this machine now: the
        # rate under churn is bounded against it (a loaded host completes fewer chats per second)
        t0 = time.monotonic()
        with ChatLoad(master, rate=2.5):
            time.sleep(10)
        quiet_rate = (state_of(master)["last_event_idx"] - idx0) / (time.monotonic() - t0)
        idx0 = state_of(master)["last_event_idx"]

        aborted = 0
        rounds = 0
        t0 = time.monotonic()
        with ChatLoad(master, rate=2.5) as load:
            # 30 s and 50 rounds at least (a round is an `ss -K` process and 0.3 s: up to ~1.5 s
            # on a loaded host), 90 s at most
            while (time.monotonic() - t0 < 30 or rounds < 50) and time.monotonic() - t0 < 90:
                aborted += kill_peer_connections(churner, churn_port)
                rounds += 1
                time.sleep(0.3)
        churn_s = time.monotonic() - t0
        idx1 = state_of(master)["last_event_idx"]
        rate = (idx1 - idx0) / churn_s
        print(f"churn: {rounds} rounds, {aborted} connections aborted, {idx1 - idx0} events in {churn_s:.1f} s ({rate:.1f}/s, {quiet_rate:.1f}/s without), chats {len(load.codes)} ok={load.codes.count(200)}")
        # the churn was real: most rounds found connections to abort (a round that finds none
        # caught the node between a reset and its reconnection, which takes a dial)
        assert rounds >= 50 and aborted >= 0.5 * rounds, f"the churn did not disconnect the node ({aborted} aborts in {rounds} rounds)"
        assert rate >= 0.5 * quiet_rate, f"the master sequenced {rate:.1f} events/s under churn, {quiet_rate:.1f} without"
        assert load.codes.count(200) >= 0.9 * len(load.codes) and not load.errors, (load.codes, load.errors[:3])

        # all alive (same processes), all converge: same master, term, last index, state hash
        assert all(n.proc.poll() is None and n.proc.pid == pid_before[n] for n in cluster.nodes)
        final = wait_until(lambda: agreement(cluster.nodes, 3), 15, what="convergence after churn")
        assert final[0] == master_id, "churn of a follower changed the master"
        # heartbeat and gossip tasks still run on every node: an event sequenced now reaches
        # everyone, and every node still hears every other (last_seen fresh)
        r = master.post("/instances", json={"model": MODEL, "nodes": [self_id(host)]})
        assert r.status_code == 201, r.text
        idx2 = r.json() and state_of(master)["last_event_idx"]
        wait_until(lambda: all(state_of(n)["last_event_idx"] >= idx2 for n in cluster.nodes), 10, what="new event reaches every node")
        time.sleep(1.5)
        for n in cluster.nodes:
            listing = n.get("/nodes").json()
            assert len(listing) == 3 and all(e["last_seen"] < 3.0 for e in listing), listing
        # counters: non-negative integers; nothing undecodable, forged or from a non-master
        for n in cluster.nodes:
            c = state_of(n)["counters"]
            assert all(isinstance(v, int) and v >= 0 for v in c.values()), c
            for bad in ("heartbeat_undecodable", "heartbeat_forged", "local_event_forged", "global_event_undecodable", "publish_failed", "publish_oversize"):
                assert c.get(bad, 0) == 0, (bad, c)
            lost = sum(v for k, v in c.items() if k.startswith("subscriber_full"))
            assert lost == 0, c
        wait_until(lambda: agreement(cluster.nodes, 3), 15, what="final convergence")


def test_quick_master_restart_settles_on_one_master(tmp_path, models_dir):
    """Quick master restart: restart only the master's process (same node id) at once: within
    ``NEW_MASTER`` (5 s, plus ``SLACK``) of its API answering again there is exactly one master that
    all three agree on (same term), the restarted node's term is at least its term before, and a placement is accepted."""
    cluster = Cluster(tmp_path, 3, extra_args=["--models-dir", str(models_dir)])
    with nodes_cleanup(cluster.nodes):
        cluster.start()
        ids = by_id(cluster.nodes)
        master_id, term_before, _, _ = wait_until(lambda: agreement(cluster.nodes), 10, interval=0.1, what="agreement after start")
        old = ids[master_id]
        survivors = [n for i, n in ids.items() if i != master_id]
        old.kill()
        restarted = NodeProcess(old.data_dir, cluster=cluster.name, extra_args=[*cluster.extra_args, "--bootstrap", survivors[0].addrs()[0]])
        cluster.nodes.append(restarted)
        restarted.start()
        t_up = time.monotonic()
        assert self_id(restarted) == master_id
        everyone = [*survivors, restarted]

        def one_master():
            ss = [state_of(n) for n in everyone]
            if any(s is None for s in ss):
                return None
            views = {(s["master"], s["term"]) for s in ss}
            if len(views) != 1 or None in next(iter(views)):
                return None
            listings = [n.get("/nodes", timeout=5).json() for n in everyone]
            return next(iter(views)) if all(sum(e["is_master"] for e in l) == 1 for l in listings) else None

        try:
            new_master, term_after = wait_until(one_master, NEW_MASTER + SLACK, interval=0.1, what="one master after the quick restart")
        except TimeoutError:
            views = [(s["node_id"][-6:], s["master"], s["term"], s["last_event_idx"], s["warnings"]) for s in map(state_of, everyone) if s]
            raise AssertionError(f"no single master {NEW_MASTER + SLACK} s after the restart: {views}\n{restarted.log_tail(30)}") from None
        took = time.monotonic() - t_up
        try:
            wait_until(lambda: agreement(everyone, 3), 15, what="all three converge after the quick restart")
        except TimeoutError:
            views = [(s["node_id"][-6:], s["master"][-6:], s["term"], s["last_event_idx"], s["state_hash"][:8], sorted(k[-6:] for k in s["nodes"]),
                      {a[-6:]: sorted(b[-6:] for b in e) for a, e in s["edges"].items()}) for s in map(state_of, everyone) if s]
            raise AssertionError(f"no convergence 15 s after the restart: {views}\n{restarted.log_tail(30)}") from None
        assert term_after >= term_before
        assert state_of(restarted)["term"] >= term_before
        # the master stays put for a while (no flip back and forth)
        for _ in range(10):
            assert {state_of(n)["master"] for n in everyone} == {new_master}
            time.sleep(0.2)
        r = restarted.post("/instances", json={"model": MODEL})
        assert r.status_code == 201, r.text
        print(f"quick restart: one master {new_master[:12]} term {term_before}->{term_after} after {took:.2f} s")


def test_duplicate_identity_is_refused_and_new_identity_fixes_it(tmp_path, models_dir):
    """Duplicate identity: a copied data dir (same identity.key) started with bootstrap to the
    original: the node that sees its own id with another boot id refuses to join and says
    why (exit code 1 and the reason on stderr); ``--new-identity`` starts a fresh id that joins."""
    nodes: list[NodeProcess] = []
    with nodes_cleanup(nodes):
        first = NodeProcess(tmp_path / "first", extra_args=["--models-dir", str(models_dir)])
        nodes.append(first)
        first.start()
        first_id = self_id(first)
        boot = first.addrs()[0]
        copy_dir = tmp_path / "copy"
        copy_dir.mkdir()
        shutil.copy2(first.data_dir / "identity.key", copy_dir / "identity.key")
        dup = NodeProcess(copy_dir, cluster=first.cluster, extra_args=["--models-dir", str(models_dir), "--bootstrap", boot])
        nodes.append(dup)
        try:
            dup.start(timeout=30)
        except RuntimeError:
            pass  # exited before its API answered: fine, the exit is checked below
        # one of the two (the one that saw the other's heartbeat) exits within 20 s and says why
        def someone_refused():
            return [n for n in (first, dup) if n.proc.poll() is not None]

        gone = wait_until(someone_refused, 20, what="a duplicate-identity refusal")
        for n in gone:
            assert n.proc.returncode == 1, n.log_tail()
            assert "identity" in n.log_tail(80) and "--new-identity" in n.log_tail(80), n.log_tail()
        # --new-identity: a fresh id that joins the original's cluster
        survivor = first if first.proc.poll() is None else dup
        fresh = NodeProcess(copy_dir if survivor is first else first.data_dir, cluster=first.cluster,
                            extra_args=["--models-dir", str(models_dir), "--new-identity", "--bootstrap", survivor.addrs()[0]])
        nodes.append(fresh)
        fresh.start()
        assert self_id(fresh) != first_id
        wait_until(lambda: agreement([survivor, fresh], 2), 20, what="fresh identity joins")
