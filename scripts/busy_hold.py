"""``scripts/busy_recipe.py --hold``: the two-node recipe held under CPU starvation, phase by
phase (the module docstring of busy_recipe.py says what each phase expects).

Figures per phase: seconds, polls of ``/state`` (one a second per node), polls without
exactly one master among the nodes that answered, the (master, term) pairs seen, new instance
ids (re-placements), "node timed out" and "late but answering" lines of the nodes' logs, runner
kills, chats completed and their speed (``tok_s``: completion tokens / request seconds, prefill
and waiting included; the nodes' logs have each request's ``decode_tps``).
"""

from __future__ import annotations

import os
import signal
import sys
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
from burners import start_burners, stop_burners  # scripts/burners.py


class Chats:
    """Back-to-back chat requests to one node's API on a thread; ``done`` holds
    ``(finished_at, completion_tokens, seconds)`` per answered request."""

    def __init__(self, api: str, model: str, prompt: str) -> None:
        self.api, self.model, self.prompt = api, model, prompt
        self.done: list[tuple[float, int, float]] = []
        self.failed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        body = {"model": self.model, "messages": [{"role": "user", "content": self.prompt}], "max_tokens": 48}
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                r = httpx.post(f"{self.api}/v1/chat/completions", json=body, timeout=300)
                tokens = r.json()["usage"]["completion_tokens"] if r.status_code == 200 else 0
            except (httpx.HTTPError, ValueError, KeyError):
                tokens = 0
            if tokens:
                self.done.append((time.monotonic(), tokens, time.monotonic() - t0))
            else:
                self.failed += 1
                time.sleep(1)

    def since(self, t0: float) -> tuple[int, float]:
        """(chats, tokens/s) of the requests finished after ``t0``."""
        rows = [d for d in self.done if d[0] >= t0]
        secs = sum(d[2] for d in rows)
        return len(rows), (sum(d[1] for d in rows) / secs if secs else 0.0)


def _state(api: str) -> dict | None:
    try:
        r = httpx.get(f"{api}/state", timeout=3)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def _count(home: Path, text: str) -> int:
    return sum(line.count(text) for name in ("a", "b") for line in (home / f"{name}.log").read_text(errors="replace").splitlines())


def baseline(apis: list[str], home: Path, killed) -> tuple:  # type: ignore[no-untyped-def]
    """What a phase's figures count from: the instance ids, timeouts, averted ones, kills, time."""
    ids = set().union(*(set((s or {}).get("instances", {})) for s in (_state(a) for a in apis)))
    return ids, _count(home, "node timed out"), _count(home, "late but answering"), len(killed(home)), time.monotonic()


def monitor(apis: list[str], seconds: float, home: Path, chats: Chats, killed, before: tuple | None = None) -> dict:  # type: ignore[no-untyped-def]
    """Poll both nodes every second for ``seconds``; the phase's figures (module docstring),
    counted from ``before`` (``baseline``; None: now)."""
    seen_instances, timed0, averted0, kills0, t0 = before or baseline(apis, home, killed)
    pairs, split, polls = set(), 0, 0
    new_instances: set[str] = set()
    while time.monotonic() - t0 < seconds:
        states = [s for s in (_state(a) for a in apis) if s is not None]
        polls += 1
        masters = {s["node_id"] for s in states if s.get("master") == s["node_id"]}
        split += len(masters) != 1
        pairs |= {(s.get("master"), s.get("term")) for s in states}
        for s in states:
            new_instances |= set(s.get("instances", {})) - seen_instances
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t0) % 1.0))
    n, tps = chats.since(t0)
    return {"seconds": round(time.monotonic() - t0), "polls": polls, "polls_not_one_master": split,
            "master_term_pairs": sorted((str(m)[-6:], t) for m, t in pairs), "re_placements": len(new_instances),
            "timed_out": _count(home, "node timed out") - timed0, "late_not_timed_out": _count(home, "late but answering") - averted0,
            "runner_kills": len(killed(home)) - kills0, "chats": n, "tok_s": round(tps, 2),
            "load": [round(x, 1) for x in os.getloadavg()]}


def _wait_master(apis: list[str], timeout: float) -> str | None:
    """The master both nodes follow, waited for up to ``timeout`` s (None: none by then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = [_state(a) for a in apis]
        if all(states) and len({s["master"] for s in states}) == 1 and states[0]["master"]:
            return states[0]["master"]
        time.sleep(1)
    print(f"no common master within {timeout} s", flush=True)
    return None


def run_hold(args, node, stop, killed) -> int:  # type: ignore[no-untyped-def]
    """The phases; 0 when each held (module docstring of busy_recipe.py)."""
    home = Path(tempfile.mkdtemp(prefix="busy-hold-"))
    api_a, listen_a, api_b, listen_b = (args.port_base + i for i in range(4))
    apis = [f"http://127.0.0.1:{api_a}", f"http://127.0.0.1:{api_b}"]
    cluster = f"busy-{os.getpid()}"
    nodes = [node("a", home, api_a, listen_a, cluster), node("b", home, api_b, listen_b, cluster)]
    burners = None
    chats = Chats(apis[1], args.model, args.prompt)
    try:
        if _wait_master(apis, 120) is None:
            return 1
        exe = str(Path(sys.executable).parent / "exo-p2p")
        placed = subprocess.run([exe, "place", args.model, "--min-nodes", "2", "--api", apis[0]], capture_output=True,
                                text=True, timeout=args.timeout, stdin=subprocess.DEVNULL)
        print(f"place: exit {placed.returncode}", placed.stdout.strip()[-300:], flush=True)
        if placed.returncode != 0:
            return 1
        chats.thread.start()
        results = {"baseline (no burners)": monitor(apis, args.baseline, home, chats, killed)}
        print(f"baseline (no burners): {results['baseline (no burners)']}", flush=True)
        burners = start_burners(args.burners, same_session=args.same_session)
        time.sleep(5)
        results[f"{args.burners} burners"] = monitor(apis, args.hold, home, chats, killed)
        print(f"{args.burners} burners: {results[f'{args.burners} burners']}", flush=True)
        master = _wait_master(apis, 60)
        follower = nodes[1] if (_state(apis[0]) or {}).get("node_id") == master else nodes[0]
        for label, pause, after in (("SIGSTOP 3 s", 3.0, 30.0), (f"SIGSTOP {args.long_stop:.0f} s", args.long_stop, 60.0)):
            before = baseline(apis, home, killed)
            follower.send_signal(signal.SIGSTOP)
            time.sleep(pause)
            follower.send_signal(signal.SIGCONT)
            results[label] = monitor(apis, pause + after, home, chats, killed, before)
            print(f"{label}: {results[label]}", flush=True)
        print("loop lag:", [(_state(a) or {}).get("counters", {}).get("loop_lag_worst_ms") for a in apis], flush=True)
        return _verdict(results, args)
    finally:
        chats.stop.set()
        for proc in nodes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
        stop(nodes)
        stop_burners(burners)
        print(f"logs kept in {home}", flush=True)


def _verdict(results: dict, args) -> int:  # type: ignore[no-untyped-def]
    hold, short, long_ = (results[k] for k in list(results)[1:4])
    ok = (hold["polls_not_one_master"] == 0 and len(hold["master_term_pairs"]) == 1 and hold["re_placements"] == 0
          and hold["runner_kills"] == 0 and short["re_placements"] == 0 and short["timed_out"] == 0
          and long_["timed_out"] == 1 and len(long_["master_term_pairs"]) == 1 and long_["runner_kills"] == 0)
    print("verdict:", "held" if ok else "did not hold", flush=True)
    return 0 if ok else 1
