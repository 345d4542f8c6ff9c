"""The README's two-node recipe on a busy machine: both cores loaded by CPU burners.

What a laptop running other things looks like (load 5–12 on 2 cores). The script starts one
busy-looping burner process per core (``--burners``, default ``os.cpu_count()``), then runs
the README's "Two nodes" block as a user would — two ``exo-p2p node`` processes on 127.0.0.1
(their own data dirs under a temporary folder, ports ``--port-base`` …+3), ``exo-p2p place
MODEL --min-nodes 2``, ``exo-p2p chat`` through the second node's API — and prints each step's
wall time, the machine's load average, and whether any runner was killed (the nodes' logs:
"runner silent" / "runner stuck"). Then it stops everything it started, by PID.

The burners are other work, as a user's other work runs: one session of their own (a
build started in another terminal), ``--same-session`` in the nodes' session instead
(scripts/burners.py says why it matters on Linux: autogroups).

A busy runner is not a dead runner (docs/architecture.md#rules, runner supervision): the
chat must answer, with no runner killed, however slow the steps are.

With ``--hold SECONDS`` (the control plane under starvation, docs/architecture.md#rules
"Liveness"), the nodes start on a quiet machine, the model is placed across both and its
decode speed measured (``--baseline`` s of back-to-back chats); then ``--burners`` (30 here:
load ≥ 30 on 2 cores) start and the chats go on for ``--hold`` seconds while ``/state`` of both
nodes is polled every second: exactly one master throughout (no term change), no
re-placement (a new instance id), no runner killed. Then the follower node is SIGSTOPped for
3 s (no re-placement expected), then past the peer timeout (``--long-stop``, 10 s: one clean
failover — the master times it out once, the instance is re-placed at most once, no term
change). Each phase prints its figures; exit 0 when every phase holds.

Usage: ``python scripts/busy_recipe.py [--model smollm2-135m-instruct] [--burners N]
[--prompt TEXT] [--timeout SECONDS] [--hold SECONDS [--baseline S] [--long-stop S]]``; exit 0
when the chat answered and no runner was killed (and, with ``--hold``, every phase held).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from burners import start_burners, stop_burners  # scripts/burners.py

BIN = Path(sys.executable).parent


def _exo(*args: str) -> list[str]:
    exe = shutil.which("exo-p2p", path=str(BIN)) or "exo-p2p"
    return [exe, *args]


def _timed(cmd: list[str], timeout: float) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return time.monotonic() - started, proc


def _node(name: str, home: Path, api: int, listen: int, cluster: str | None = None) -> subprocess.Popen[bytes]:
    cmd = _exo("node", "--name", name, "--data-dir", str(home / name), "--api-port", str(api),
               "--listen-port", str(listen), "--log-file", str(home / f"{name}.log"),
               *(["--cluster", cluster] if cluster else []))
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _report(step: str, seconds: float, proc: subprocess.CompletedProcess[str]) -> None:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{step}: exit {proc.returncode} in {seconds:.1f} s (load {load})", flush=True)
    if proc.returncode != 0 or step == "chat":
        print("  stdout:", proc.stdout.strip()[-600:], "\n  stderr:", proc.stderr.strip()[-600:], flush=True)


def killed_runners(home: Path) -> list[str]:
    """The nodes' log lines that say a runner was killed."""
    return [line for name in ("a", "b") for line in (home / f"{name}.log").read_text(errors="replace").splitlines()
            if "runner silent" in line or "runner stuck" in line]


def run(args: argparse.Namespace) -> int:
    if args.hold:
        from busy_hold import run_hold  # scripts/busy_hold.py

        return run_hold(args, _node, _stop, killed_runners)
    """The recipe under load; 0 when the chat answered and no runner was killed."""
    home = Path(tempfile.mkdtemp(prefix="busy-recipe-"))
    burners = start_burners(args.burners, same_session=args.same_session)
    api_a, listen_a, api_b, listen_b = (args.port_base + i for i in range(4))
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        time.sleep(5)  # the burners take the cores before anything starts
        print(f"{args.burners} burners running; load {os.getloadavg()[0]:.1f}", flush=True)
        nodes += [_node("a", home, api_a, listen_a), _node("b", home, api_b, listen_b)]
        took, proc = _timed(_exo("place", args.model, "--min-nodes", "2", "--api", f"http://127.0.0.1:{api_a}"), args.timeout)
        _report("place --min-nodes 2", took, proc)
        if proc.returncode != 0:
            return 1
        took, proc = _timed(_exo("chat", "--api", f"http://127.0.0.1:{api_b}", args.prompt), args.timeout)
        _report("chat", took, proc)
        killed = killed_runners(home)
        print(f"runners killed: {len(killed)}", *killed[:3], sep="\n", flush=True)
        return 0 if proc.returncode == 0 and proc.stdout.strip() and not killed else 1
    finally:
        _stop(nodes)
        stop_burners(burners)
        shutil.rmtree(home, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--burners", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--prompt", default="Why is the sky blue?")
    parser.add_argument("--port-base", type=int, default=53600)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--hold", type=float, default=0.0, help="seconds under burners with chats running (0: the plain recipe)")
    parser.add_argument("--baseline", type=float, default=30.0, help="seconds of chats before the burners start")
    parser.add_argument("--same-session", action="store_true",
                        help="burners in the nodes' own session (Linux autogroup: they then share the nodes' CPU group)")
    parser.add_argument("--long-stop", type=float, default=10.0, help="seconds of the SIGSTOP past the peer timeout")
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
