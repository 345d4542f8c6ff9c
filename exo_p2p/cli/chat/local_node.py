"""A node started by ``exo-p2p run`` for the duration of the command, and stopped after.

The node runs as ``python -m exo_p2p node`` in its own session (so Ctrl-C in the terminal
reaches only the CLI, which then stops the node in order), with its output in a log file in
the data dir. ``running_node`` guarantees the process is gone when it exits, on success,
error or Ctrl-C: SIGTERM, wait ``STOP_TIMEOUT`` seconds, then SIGKILL.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from rich.console import Console

from exo_p2p.cli.node_api.client import NodeClient
from exo_p2p.cli.errors import CliError
from exo_p2p.cli.chat.private_state import private_state

LOG_NAME = "run-node.log"
START_TIMEOUT = 180.0
"""Seconds to wait for a started node to answer ``GET /state``."""
STOP_TIMEOUT = 20.0
"""Seconds a node gets to stop after SIGTERM before it is killed."""
LOG_TAIL_LINES = 20


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def node_command(api_port: int, data_dir: Path, private: bool = True) -> list[str]:
    """The argv of the node started by ``run``: API on ``api_port`` (127.0.0.1), libp2p on a
    free port chosen by the node, state in ``data_dir``. ``private``: a cluster of its own
    (a random cluster name), no mDNS, libp2p on loopback only, so its placements never land
    on other machines; else the LAN's default cluster, found by mDNS."""
    argv = [
        sys.executable, "-m", "exo_p2p", "node",
        "--api-port", str(api_port),
        "--listen-port", "0",
        "--data-dir", str(data_dir),
    ]  # fmt: skip
    if private:
        argv += ["--cluster", f"run-{secrets.token_hex(6)}", "--no-mdns", "--listen-host", "127.0.0.1"]
    return argv


def log_tail(path: Path, lines: int = LOG_TAIL_LINES, start: int = 0) -> str:
    """The last ``lines`` lines of the log at ``path`` from byte ``start`` on (what this run
    appended); "" when there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def start_failure(what: str, log_path: Path, start: int = 0) -> str:
    """The error for a node that did not come up: the node's own reason first (its last
    ``error:`` line of this run), then where its log is and this run's last lines."""
    tail = log_tail(log_path, start=start)
    reasons = [line.removeprefix("error:").strip() for line in tail.splitlines() if line.startswith("error:")]
    text = f"could not start a node: {reasons[-1]} ({what})" if reasons else f"could not start a node: {what}"
    text += f"; its log is {log_path}"
    return f"{text}; this run's last lines:\n{tail}" if tail else text


def stop_process(process: subprocess.Popen, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM ``process``, wait up to ``timeout`` seconds, then SIGKILL and reap it.
    A second Ctrl-C while waiting kills at once. Never raises for a process already gone."""
    if process.poll() is not None:
        return
    try:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    except KeyboardInterrupt:
        pass
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def _wait_for_api(
    process: subprocess.Popen, api_url: str, log_path: Path, timeout: float, console: Console, start: int = 0
) -> None:
    """Poll ``GET /state`` until it answers; ``CliError`` with the log tail if the process
    exits or ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    with NodeClient(api_url) as client, console.status("starting a node…"):
        while True:
            if client.ping(timeout=1.0):
                return
            code = process.poll()
            if code is not None:
                raise CliError(start_failure(f"the node exited with code {code}", log_path, start))
            if time.monotonic() >= deadline:
                raise CliError(
                    start_failure(f"the node did not answer within {timeout:g} s", log_path, start)
                )
            time.sleep(0.2)


@contextmanager
def running_node(
    data_dir: Path, console: Console, *, start_timeout: float = START_TIMEOUT, private: bool = True
) -> Iterator[str]:
    """Start a node with its state in ``data_dir`` (``private``: in a fresh state dir of its
    own that shares ``data_dir``'s models, ``exo_p2p.cli.chat.private_state``), wait until its API
    answers, yield the API URL; stop the node (and reap it) on leaving, however the block ends.

    Raises ``CliError`` (with the tail of the node's log) when it does not come up.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        state_dir = stack.enter_context(private_state(data_dir)) if private else data_dir
        yield from _run_node(data_dir, state_dir, console, start_timeout, private)


def _run_node(data_dir: Path, state_dir: Path, console: Console, start_timeout: float, private: bool) -> Iterator[str]:
    """``running_node``'s body: the node's state in ``state_dir``, its log in ``data_dir``."""
    api_port = free_port()
    api_url = f"http://127.0.0.1:{api_port}"
    log_path = data_dir / LOG_NAME
    from exo_p2p.logs.rotation import RUN_LOG_MAX_BYTES, rotate_if_larger  # structlog: only when a node starts

    try:
        rotate_if_larger(log_path, RUN_LOG_MAX_BYTES)  # bounded on disk (exo_p2p.logs.rotation)
    except OSError as exc:
        console.print(f"[yellow]warning:[/] could not rotate {log_path}: {exc}")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with open(log_path, "ab") as log:
        start = log.tell()
        process = subprocess.Popen(
            node_command(api_port, state_dir, private),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        _wait_for_api(process, api_url, log_path, start_timeout, console, start)
        yield api_url
    finally:
        with console.status("stopping the node…"):
            stop_process(process)
