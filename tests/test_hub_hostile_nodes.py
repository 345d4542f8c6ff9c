"""Untrusted model sources cannot hurt a node (docs/security.md, "A model hub is untrusted"):
a real node on loopback asked about hostile repos on the stand-in hub (``tests/support/models/hub_hostile.py``)
refuses each with a 400 naming the field and the limit, within a bound, while its memory stays
within ``RSS_BOUND`` of where it started and ``/health`` answers within ``HEALTH_BOUND`` (plus
the worst the idle node showed first: this machine's noise) throughout; a preview adds nothing to State; a trickling hub neither holds a good placement
back (within 2× its time alone) nor keeps the node from stopping on SIGTERM, and a client
that waits on it gets a 504 at ``RESOLVE_DEADLINE``.

Figures (measured by these tests) are logged with ``print`` (``pytest -s`` shows them)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from exo_p2p.models.hub_limits import (MAX_CONFIG_BYTES, MAX_HEADERS_BYTES, MAX_LISTING_BYTES, MAX_REPO_FILES,
                                       MAX_WEIGHT_FILE_BYTES, RESOLVE_DEADLINE)
from exo_p2p.models.hub.manifest import MAX_HEADER_BYTES
from tests.support.models.synthetic_models import make_synthetic_model
from tests.support.cluster import NodeProcess, wait_until
from tests.support.models.hub_hostile import Hostile, HostileHub

pytestmark = pytest.mark.integration
RSS_BOUND = 200 * 1024 * 1024
"""Bytes a node's RSS may grow by over its baseline while it refuses hostile repos (stated bound)."""
HEALTH_BOUND = 1.0
"""Seconds ``/health`` may take at most while the node is attacked."""
ANSWER_BOUND = 20.0
"""Seconds a refusal may take (generous: a few loopback requests on a loaded machine)."""
IDLE_WATCH = 3.0
"""Seconds the node is watched idle first (the machine's own ``/health`` noise)."""
TRICKLERS = 45
"""Trickling previews beside the good placement (what the attacker sent)."""


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile-models")
    out = {}
    for name, seed in (("tiny", 3), ("tiny2", 4)):
        make_synthetic_model(root / name, n_layers=4, hidden_size=64, intermediate_size=128, seed=seed)
        out[name] = root / name
    layers = root / "layers"
    shutil.copytree(out["tiny"], layers)
    config = json.loads((layers / "config.json").read_text())
    (layers / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1_000_000_000}))
    big = root / "bigconfig"
    shutil.copytree(out["tiny"], big)
    (big / "config.json").write_text(json.dumps(config) + " " * (200 * 1024 * 1024))
    headers = root / "headers"  # 10 weight files, each a header of ~4 MiB (spaces pad it) and no data
    headers.mkdir()
    shutil.copy(out["tiny"] / "config.json", headers / "config.json")
    for i in range(10):
        body = json.dumps({"__metadata__": {"format": "mlx"}}).encode()
        body += b" " * (MAX_HEADER_BYTES - 16 - len(body))
        (headers / f"model-{i:05d}-of-00010.safetensors").write_bytes(len(body).to_bytes(8, "little") + body)
    out.update(layers=layers, bigconfig=big, headers=headers)
    return out


@pytest.fixture()
def hub(models):
    with HostileHub() as server:
        for name in ("tiny", "tiny2", "layers", "bigconfig", "headers"):
            server.add_dir(f"org/{name}", models[name])
        for name in ("hugefile", "siblings", "siblings20k", "padded", "trickle"):
            server.add_dir(f"org/{name}", models["tiny"])
        server.hostile = {
            "org/layers": Hostile(),
            "org/headers": Hostile(),
            "org/bigconfig": Hostile(),
            "org/hugefile": Hostile(listed={"model.safetensors": 1 << 62}),
            "org/siblings": Hostile(siblings=500_000),
            "org/siblings20k": Hostile(siblings=2 * MAX_REPO_FILES),
            "org/padded": Hostile(ignore_range=("config.json",), padding=200 * 1024 * 1024),
            "org/trickle": Hostile(trickle=1.0),
        }
        for repo in server.hostile:
            server.listing(repo)  # built now, not while the node is watched
        yield server


_WATCHER = """
import json, os, sys, time
import httpx, psutil
url, pid, stop_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
proc = psutil.Process(pid)
base = peak = proc.memory_info().rss
worst, failures, polls = 0.0, 0, 0
while not os.path.exists(stop_file):
    started = time.monotonic()
    try:
        ok = httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        ok = False
    worst, polls, failures = max(worst, time.monotonic() - started), polls + 1, failures + (not ok)
    peak = max(peak, proc.memory_info().rss)
    time.sleep(0.1)
print(json.dumps({"base": base, "peak": peak, "worst": worst, "failures": failures, "polls": polls}))
"""


class Watch:
    """Polls a node's ``/health`` (worst latency, failures) and RSS (psutil; the peak) every
    0.1 s until ``stop()``, from a child process: the stand-in hub runs in this one, and its
    threads (a 50 MB listing, 200 MB answers) would slow a watch here, not the node."""

    def __init__(self, node: NodeProcess, stop_file: Path) -> None:
        self.stop_file, self.node = stop_file, node
        self.proc = subprocess.Popen([sys.executable, "-c", _WATCHER, node.url, str(node.proc.pid), str(stop_file)],  # type: ignore[union-attr]
                                     stdout=subprocess.PIPE, text=True)
        self.got: dict = {}

    def stop(self) -> None:
        self.stop_file.touch()
        out, _ = self.proc.communicate(timeout=30)
        self.got = json.loads(out)

    def report(self, what: str) -> str:
        g = self.got
        return (f"{what}: RSS {g['base'] >> 20} -> peak {g['peak'] >> 20} MB (+{(g['peak'] - g['base']) >> 20} MB), "
                f"/health worst {g['worst'] * 1000:.0f} ms over {g['polls']} polls, {g['failures']} failed")

    def check(self, what: str, idle: Watch) -> None:
        """Assert the bounds: RSS within ``RSS_BOUND``; ``/health`` always answered, within
        ``HEALTH_BOUND`` plus the worst ``idle`` saw (measured first: this machine's own noise,
        as other work shares its cores, or a placement's own when one is compared)."""
        lag = _loop_lag(self.node)
        print(self.report(what), f"(idle worst {idle.got['worst'] * 1000:.0f} ms; node loop lag worst {lag} ms)")
        assert self.got["peak"] - self.got["base"] <= RSS_BOUND, self.report(what)
        assert not self.got["failures"] and self.got["polls"] > 0, self.report(what)
        assert self.got["worst"] <= HEALTH_BOUND + idle.got["worst"], self.report(what)


def _loop_lag(node: NodeProcess) -> object:
    """The node's own worst event-loop lag (``GET /state`` counter ``loop_lag_worst_ms``)."""
    def find(x: object) -> object:
        if isinstance(x, dict):
            if "loop_lag_worst_ms" in x:
                return x["loop_lag_worst_ms"]
            return next((v for v in map(find, x.values()) if v is not None), None)
        return None

    return find(node.get("/state").json())


def _idle(node: NodeProcess, path: Path) -> Watch:
    """A ``Watch`` over ``IDLE_WATCH`` s with nothing asked of the node: the machine's noise."""
    idle = Watch(node, path)
    time.sleep(IDLE_WATCH)
    idle.stop()
    return idle


def _start(nodes: list, path: Path, hub: HostileHub) -> NodeProcess:
    env = {"HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0", "HF_HOME": str(path / "hf")}
    node = NodeProcess(path, env=env).start()
    nodes.append(node)
    wait_until(lambda: node.get("/state").json()["master"] is not None, 40, what="a master")
    return node


def _hub_state(node: NodeProcess) -> tuple[int, int]:
    state = node.get("/state").json()
    return len(state.get("model_cards") or {}), len(state.get("hub_models") or {})


CASES = [
    # repo, what the 400 must name
    ("org/layers", "num_hidden_layers is 1000000000"),
    ("org/hugefile", f"listed size of model.safetensors is {1 << 62}, more than the limit of {MAX_WEIGHT_FILE_BYTES}"),
    ("org/siblings", f"more than the limit of {MAX_LISTING_BYTES} bytes"),
    ("org/siblings20k", f"file count (siblings) is {2 * MAX_REPO_FILES + 5}, more than the limit of {MAX_REPO_FILES}"),
    ("org/bigconfig", f"more than the limit of {MAX_CONFIG_BYTES} bytes"),
    ("org/headers", f"more than the limit of {MAX_HEADERS_BYTES} bytes together"),
]


def test_hostile_repos_get_a_400_naming_the_bound_and_the_node_stays_well(tmp_path, nodes, hub, models):
    node = _start(nodes, tmp_path / "n", hub)
    before = _hub_state(node)
    idle = _idle(node, tmp_path / "idle.stop")
    watch = Watch(node, tmp_path / "watch.stop")
    try:
        for repo, says in CASES:
            for method, send in (("preview", lambda r: node.get("/instances/previews", params={"model": r}, timeout=60)),
                                 ("place", lambda r: node.post("/instances", json={"model": r}, timeout=60))):
                started = time.monotonic()
                r = send(repo)
                took = time.monotonic() - started
                print(f"{repo} {method}: {r.status_code} in {took:.2f} s")
                assert r.status_code == 400, (repo, r.text)
                assert r.json()["error"]["param"] == "model" and says in r.json()["error"]["message"], r.text
                assert took <= ANSWER_BOUND
        # a server sending 200 MB more than the listed size: cut at the listed size, harmless
        r = node.get("/instances/previews", params={"model": "org/padded"}, timeout=60)
        assert r.status_code == 200 and r.json(), r.text
        assert _hub_state(node) == before  # a preview adds nothing to State
        cli = subprocess.run([sys.executable, "-m", "exo_p2p", "previews", "org/layers", "--api", node.url],
                             capture_output=True, text=True, timeout=60)
        print("CLI:", cli.returncode, cli.stderr.strip()[:300])
        assert cli.returncode != 0 and "num_hidden_layers is 1000000000" in cli.stderr + cli.stdout
    finally:
        watch.stop()
    watch.check("hostile repos", idle)


def _place_ready(node: NodeProcess, model: str) -> float:
    started = time.monotonic()
    r = node.post("/instances", json={"model": model}, timeout=120)
    assert r.status_code == 201, r.text
    iid = r.json()["instance_id"]

    def ready():
        view = node.get(f"/instances/{iid}").json()
        assert view["status"] != "failed", view
        return view["status"] == "ready"

    wait_until(ready, 120, interval=0.1, what=f"{model} ready")  # generous: a model load on a busy machine
    return time.monotonic() - started


def _trickling_previews(node: NodeProcess, n: int, leave_after: float) -> None:
    """``n`` previews of the trickling repo, each client gone after ``leave_after`` s."""
    def one(_: int) -> None:
        try:
            httpx.get(f"{node.url}/instances/previews", params={"model": "org/trickle"}, timeout=leave_after)
        except httpx.HTTPError:
            pass

    with ThreadPoolExecutor(max_workers=n) as pool:
        list(pool.map(one, range(n)))


PLACE_SLACK = 3.0
"""Seconds of slack on the 2x bound of a good placement beside a trickling hub (a runner
start's variation between two runs under three test workers; docs/testing.md#bounds)."""


@pytest.mark.timeout(400)  # expensive: two placements (model loads) and 45 stalled clients
def test_a_trickling_hub_neither_holds_back_a_good_placement_nor_the_node_stopping(tmp_path, nodes, hub):
    node = _start(nodes, tmp_path / "n", hub)
    idle = Watch(node, tmp_path / "idle.stop")  # the reference: /health while a placement runs alone
    try:
        alone = _place_ready(node, "org/tiny")
    finally:
        idle.stop()
    before = _hub_state(node)
    watch = Watch(node, tmp_path / "watch.stop")
    try:
        attack = threading.Thread(target=_trickling_previews, args=(node, TRICKLERS, 20.0), daemon=True)
        attack.start()
        wait_until(lambda: hub.trickling >= 1, 20, what="the trickling hub asked")
        beside = _place_ready(node, "org/tiny2")
        attack.join(timeout=60)
        # every client gone: the node stops reading the trickling repo (its next byte, or the socket timeout)
        wait_until(lambda: hub.trickling == 0, 40, what="the trickling reads abandoned")
    finally:
        watch.stop()
    print(f"good placement alone {alone:.2f} s, beside {TRICKLERS} trickling previews {beside:.2f} s")
    watch.check("trickling hub", idle)
    # 2x its time alone, plus PLACE_SLACK: under three test workers on 2 cores one placement
    # (mostly a runner start) varies by seconds between two runs whatever the hub does (a CI run:
    # 1.85 s alone, 3.96 s beside; alone on a quiet machine: 1.42 s and 1.60 s)
    assert beside <= 2 * alone + PLACE_SLACK, (alone, beside)
    assert _hub_state(node)[1] == before[1] + 1  # the placement's model only, no preview's
    # SIGTERM while previews of the trickling repo wait: the node stops promptly
    attack = threading.Thread(target=_trickling_previews, args=(node, 5, 30.0), daemon=True)
    attack.start()
    wait_until(lambda: hub.trickling >= 1, 20, what="the trickling hub asked")
    started = time.monotonic()
    node.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    node.proc.wait(timeout=30)  # type: ignore[union-attr]
    took = time.monotonic() - started
    print(f"SIGTERM to exit with trickling previews in flight: {took:.2f} s")
    assert took <= 5.0
    attack.join(timeout=40)


@pytest.mark.timeout(300)  # waits out the product's RESOLVE_DEADLINE (60 s) once
def test_a_client_that_waits_on_a_trickling_hub_gets_a_504_at_the_deadline(tmp_path, nodes, hub):
    node = _start(nodes, tmp_path / "n", hub)
    before = _hub_state(node)
    idle = _idle(node, tmp_path / "idle.stop")
    watch = Watch(node, tmp_path / "watch.stop")
    try:
        started = time.monotonic()
        r = node.get("/instances/previews", params={"model": "org/trickle"}, timeout=RESOLVE_DEADLINE + 60)
        took = time.monotonic() - started
    finally:
        watch.stop()
    print(f"trickling repo, client waiting: {r.status_code} after {took:.1f} s")
    watch.check("504 at the deadline", idle)
    assert r.status_code == 504 and f"deadline of {RESOLVE_DEADLINE:g} s" in r.json()["error"]["message"], r.text
    assert RESOLVE_DEADLINE - 1 <= took <= RESOLVE_DEADLINE + 15  # slack: the next trickled byte, a loaded machine
    wait_until(lambda: hub.trickling == 0, 40, what="the trickling read ended")
    assert _hub_state(node) == before


def test_hub_errors_keep_their_advice_and_an_endless_error_body_is_not_read_whole(hub, monkeypatch):
    """In this process: a missing repo, a gated one, a revision not found are named as
    ``huggingface_hub`` names them (from at most ``MAX_ERROR_BYTES`` of the error's body), and
    a 401 whose body is 200 MB is answered as fast as a small one."""
    from exo_p2p.models.hub.client import HubClient, HubError

    from huggingface_hub import constants

    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # read at import: .ci/run sets HF_HUB_OFFLINE=1
    hub.repos["org/endless"] = hub.repos["org/tiny"]
    hub.hostile["org/endless"] = Hostile(error_body=200 * 1024 * 1024)
    for repo, revision, says in (("org/missing", None, "not found"), ("org/tiny", "nope", "revision 'nope' not found"),
                                 ("org/endless", None, "not found")):
        started = time.monotonic()
        tracemalloc.start()
        try:
            with pytest.raises(HubError, match=says):
                HubClient(repo, revision).info()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert time.monotonic() - started < ANSWER_BOUND
        assert peak < 16 * 1024 * 1024, (repo, peak)  # the 200 MB body was not read
    hub.faults.token = "tok"
    with pytest.raises(HubError, match="is gated"):
        HubClient("org/tiny").info()
