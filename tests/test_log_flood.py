"""A flood of the largest requests the API accepts, from one client, against a 2-node closed
cluster: the master stays master (no new term), each request adds a bounded number of bytes
to the log, and both nodes' disk use stays bounded (docs/architecture.md#log-guarantees,
docs/security.md).

Each request is as large as the bounds allow (``exo_p2p.api.bounds``): 16 stop strings of
256 bytes and a prompt filling the rest of the 128 KiB command, which the master's size check
lets through (the tiny model's context of 2,048 tokens admits up to 128 KiB of prompt at 64
bytes a token), so its ``TaskCreated`` carries ~128 KiB into both nodes' logs. The runner
then counts the prompt's tokens exactly and refuses it (a 400 naming the context): the
cheapest way for a client to put the most bytes into the log per second.

Duration: until ``FLOOD_BYTES`` of commands reached the log (``LOG_BOUND`` + 4 MiB, ~190
requests, so a log compacted only by count, at 20,000 events, outgrows ``LOG_BOUND`` and fails
the test), at most ``FLOOD_MAX_SECONDS``: 30-70 s here at 2.8-6.5 requests/s (measured on 2
shared cores, busy to idle), which the suite can afford where the acceptance figure of 60 s
would add nothing the assertions need. With
``EXO_P2P_FLOOD_SECONDS=60`` the flood lasts exactly that long instead (how the acceptance
figures were measured; ``-s`` prints them).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import openai
import pytest

from exo_p2p import defaults
from exo_p2p.api.bounds import MAX_COMMAND_BYTES, MAX_STOP_BYTES, MAX_STOP_STRINGS
from exo_p2p.eventlog import encode_frame, scan_frames
from exo_p2p.types import TaskCreated
from tests.support.cluster import Cluster, make_secret, nodes_cleanup, state_of, wait_until
from tests.conftest import tiny_models_dir

pytestmark = pytest.mark.integration
MODEL = "tiny"
FLOOD_SECONDS = float(os.environ.get("EXO_P2P_FLOOD_SECONDS", "0")) or None
"""How long the flood lasts when set (the acceptance run: 60 s); None: until ``FLOOD_BYTES``."""
FLOOD_BYTES = defaults.LOG_COMPACT_BYTES + defaults.LOG_SERVE_MAX_BYTES + 4 * 1024 * 1024
"""Bytes of commands the suite's flood sends at least: ``LOG_BOUND`` and 4 MiB (module docstring)."""
FLOOD_MAX_SECONDS = 150.0
"""The suite's flood stops after this long even short of ``FLOOD_BYTES`` (generous: 30-70 s
measured; the test then fails saying the flood was too slow to test compaction)."""
CLIENTS = 8
"""Requests in flight at once (one client process, 8 threads: well below ``--queue-limit``)."""
PER_REQUEST_BYTES = MAX_COMMAND_BYTES + 8 * 1024
"""What one request may add to a node's log at most: its ``TaskCreated`` (the command's
bytes plus a few hundred) and the small events of its life (status, deletion), each a frame
of tens of bytes, plus its share of the cluster's own events meanwhile."""
LOG_BOUND = defaults.LOG_COMPACT_BYTES + defaults.LOG_SERVE_MAX_BYTES
"""``events.log`` at most: compacted at ``LOG_COMPACT_BYTES``, checked after each group commit,
which applies one gossip message (512 KiB) or one log response (``LOG_SERVE_MAX_BYTES``)."""
SNAPSHOT_BOUND = (CLIENTS + 1) * PER_REQUEST_BYTES
"""``snapshot.msgpack`` at most: State, whose bulk is the tasks in flight (``CLIENTS``)."""


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tiny_models_dir(tmp_path_factory, n_layers=2, seed=3)


def largest_request() -> dict:
    """Keyword arguments of ``chat.completions.create`` for a request just under the command bound."""
    stop = [f"{i:02d}" + "s" * (MAX_STOP_BYTES - 2) for i in range(MAX_STOP_STRINGS)]
    prompt = "x" * (MAX_COMMAND_BYTES - MAX_STOP_STRINGS * (MAX_STOP_BYTES + 3) - 1024)  # 1 KiB for the rest of the command
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "stop": stop, "max_tokens": 1, "temperature": 0}


def disk(node_dir: Path) -> dict[str, int]:
    """Bytes of the log, the snapshot and the whole data dir (the node's own log file aside)."""
    files = [p for p in node_dir.rglob("*") if p.is_file() and p.name != "node.log"]
    size = {p.name: p.stat().st_size for p in files if p.name in ("events.log", "snapshot.msgpack")}
    return {"log": size.get("events.log", 0), "snapshot": size.get("snapshot.msgpack", 0),
            "dir": sum(p.stat().st_size for p in files if p.exists())}


def log_tail_per_request(path: Path) -> tuple[int, int]:
    """(bytes, TaskCreated events) of the log file as it stands (the tail after the last compaction)."""
    events, _ = scan_frames(path.read_bytes())
    return sum(len(encode_frame(e)) for e in events), sum(isinstance(e.event, TaskCreated) for e in events)


@pytest.mark.timeout(int(FLOOD_SECONDS or FLOOD_MAX_SECONDS) + 240)
def test_a_flood_of_the_largest_requests_keeps_the_master_and_bounds_the_log(tmp_path, models_dir):
    secret = make_secret(tmp_path / "cluster.secret")
    cluster = Cluster(tmp_path, 2, extra_args=["--cluster-secret", str(secret), "--models-dir", str(models_dir)])
    with nodes_cleanup(cluster.nodes):
        cluster.start()
        a, b = cluster.nodes
        a.place_and_wait(MODEL, timeout=120)
        before = state_of(a)
        master, term, idx0 = before["master"], before["term"], before["last_event_idx"]
        client = openai.OpenAI(base_url=f"{b.url}/v1", api_key="unused", max_retries=0, timeout=60)
        kwargs = largest_request()
        with pytest.raises(openai.BadRequestError) as first:  # reaches the log, then the runner refuses it
            client.chat.completions.create(**kwargs)
        assert "context" in str(first.value) and "request_too_large" not in str(first.value), first.value

        started = time.monotonic()
        stop_at = started + (FLOOD_SECONDS or FLOOD_MAX_SECONDS)
        outcomes: dict[str, int] = {}
        lock = threading.Lock()

        def going() -> bool:
            if FLOOD_SECONDS is None and outcomes.get("400", 0) * MAX_COMMAND_BYTES >= FLOOD_BYTES:
                return False
            return time.monotonic() < stop_at

        def flood() -> None:
            while going():
                try:
                    client.chat.completions.create(**kwargs)
                    kind = "200"
                except openai.APIStatusError as exc:
                    kind = str(exc.status_code)
                except openai.APIError as exc:
                    kind = type(exc).__name__
                with lock:
                    outcomes[kind] = outcomes.get(kind, 0) + 1

        threads = [threading.Thread(target=flood, daemon=True) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        peak = {n.data_dir.name: {"log": 0, "snapshot": 0, "dir": 0} for n in cluster.nodes}
        seen: set[tuple[str, int]] = set()
        heard = 0.0  # the longest either node went without the other's heartbeat, seconds
        while any(t.is_alive() for t in threads):
            for n in cluster.nodes:
                now = disk(n.data_dir)
                peak[n.data_dir.name] = {k: max(v, now[k]) for k, v in peak[n.data_dir.name].items()}
                heard = max([heard, *(p["last_seen"] for p in n.get("/nodes", timeout=10).json() if not p["is_self"])])
            if (s := state_of(a, timeout=10)) is not None:
                seen.add((s["master"], s["term"]))
            time.sleep(0.2)
        for t in threads:
            t.join(timeout=90)
        elapsed = time.monotonic() - started

        wait_until(lambda: all((s := state_of(n)) and not s["tasks"] for n in cluster.nodes), 60, what="no task left in State")
        after = [state_of(n) for n in cluster.nodes]
        requests = sum(outcomes.values())
        tails = [log_tail_per_request(n.data_dir / "events.log") for n in cluster.nodes]
        figures = {"seconds": round(elapsed, 1), "requests": requests, "heartbeat_age_max": heard, "outcomes": outcomes,
                   "events": after[0]["last_event_idx"] - idx0, "node_log": [(n.data_dir / "node.log").stat().st_size for n in cluster.nodes], "peak": peak, "tails": tails,
                   "counters": [{k: v for k, v in s["counters"].items() if "fail" in k or "drop" in k or "fetch" in k} for s in after]}
        print("flood figures:", figures)

        assert seen == {(master, term)}, f"the master or term changed during the flood: {seen}"
        assert all((s["master"], s["term"]) == (master, term) for s in after), after
        assert heard < defaults.PEER_TIMEOUT / 2, f"a heartbeat was {heard} s late during the flood ({figures})"
        assert outcomes.get("400", 0) >= 0.9 * requests, outcomes  # each one reached the log; none was refused earlier
        pushed = outcomes.get("400", 0) * MAX_COMMAND_BYTES
        assert pushed > LOG_BOUND, f"the flood pushed only {pushed} bytes: too slow to test compaction ({figures})"
        for name, p in peak.items():
            assert p["log"] <= LOG_BOUND, f"{name}: events.log reached {p['log']} bytes ({figures})"
            assert p["snapshot"] <= SNAPSHOT_BOUND, f"{name}: snapshot reached {p['snapshot']} bytes ({figures})"
            assert p["dir"] <= LOG_BOUND + SNAPSHOT_BOUND + 4 * 1024 * 1024, f"{name}: data dir reached {p['dir']} bytes ({figures})"
        for size, created in tails:
            if created >= 10:
                assert size / created <= PER_REQUEST_BYTES, f"{size / created:.0f} bytes of log per request ({figures})"
