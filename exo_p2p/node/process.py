"""A node's OS process around its trio run: the checks before it starts (its ports, the
data-dir lock), the signals it stops on, and its exit code. Knows nothing of what a node
runs: ``run_process`` takes the node to build as a callable (``exo_p2p.node.node.run_node``)."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import structlog
import trio

from exo_p2p.config import NodeConfig
from exo_p2p.limits import guard_setrlimit, keep_nofile
from exo_p2p.logs import rotation as log_rotation
from exo_p2p.logs.configure import configure_logging, report_error

log = structlog.get_logger("exo_p2p.node")


class RunnableNode(Protocol):
    """What ``run_process`` needs of a node: it runs until cancelled, may give a reason it
    gave up, and closes its log."""

    exit_reason: str | None

    async def run(self) -> None: ...

    def close(self) -> None: ...


class StartupError(Exception):
    """The node cannot start (port in use, data dir used by another node); one-line message."""


def host_name() -> str:
    """This machine's host name: a node's friendly name when none is configured."""
    return socket.gethostname()


def stop_signals() -> tuple[int, ...]:
    """The signals a node stops on, as on SIGTERM (runners shut down, the log closed):
    SIGINT, SIGTERM, and SIGHUP (the terminal it runs in was closed) unless SIGHUP is ignored
    (``nohup``: the user asked the node to outlive its terminal)."""
    hup = () if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else (signal.SIGHUP,)
    return (signal.SIGINT, signal.SIGTERM, *hup)


async def run_until_signal(node: RunnableNode) -> None:
    """Run ``node`` until one of ``stop_signals`` arrives or the node gives up by itself."""
    with trio.open_signal_receiver(*stop_signals()) as signals:
        async with trio.open_nursery() as nursery:

            async def run_then_stop() -> None:
                await node.run()  # returns when the node gives up (e.g. a duplicate identity)
                nursery.cancel_scope.cancel()

            nursery.start_soon(run_then_stop)

            async def stop_on_signal() -> None:
                async for signum in signals:
                    log.info("stopping", signal=signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(stop_on_signal)


def check_ports(config: NodeConfig) -> None:
    """Raise ``StartupError`` when the API or libp2p port is taken by a live listener (a
    port 0 is never taken). Connections of a node that just died, left in TIME_WAIT, do not
    count: the probe binds with ``SO_REUSEADDR`` as the servers do (hypercorn, trio)."""
    for what, host, port, flag in (
        ("API", config.api_host, config.api_port, "--api-port"),
        ("libp2p", config.listen_host, config.listen_port, "--listen-port"),
    ):
        if port == 0:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as exc:
                raise StartupError(f"{what} port {port} on {host} is not available ({exc.strerror}); is another exo-p2p node running? choose another with {flag}") from None


def lock_data_dir(data_dir: Path):  # type: ignore[no-untyped-def]
    """Create ``data_dir`` (mode 0700) and take its ``node.lock``: an open file holding an
    exclusive ``flock`` and this process's pid, to keep for the process lifetime. Raises
    ``StartupError`` when the dir cannot be used or another node process holds the lock."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = open(data_dir / "node.lock", "a+")
    except OSError as exc:
        raise StartupError(f"cannot use the data dir {data_dir}: {exc.strerror or exc}; choose another with --data-dir") from None
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        other = lock.read().strip() or "?"
        lock.close()
        raise StartupError(f"another exo-p2p node (pid {other}) is using the data dir {data_dir}; stop it or use --data-dir") from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


def check_can_start(config: NodeConfig):  # type: ignore[no-untyped-def]
    """Fail fast, before joining anything, when the node could not run: the API or libp2p
    port is taken, or another node process uses the same data dir (two nodes on one data
    dir would share an identity and an event log). Returns the data-dir lock (an open file
    holding an exclusive ``flock``), to keep for the process lifetime. Raises StartupError."""
    check_ports(config)
    return lock_data_dir(Path(config.data_dir))


def first_leaf(exc: BaseException) -> BaseException:
    """The first exception that is no group, looking into nested exception groups (trio
    nests one group per nursery level; a group's own message only counts its members)."""
    while isinstance(exc, BaseExceptionGroup):  # noqa: F821 - Python 3.11 builtin
        exc = exc.exceptions[0]
    return exc


def prepare_process(config: NodeConfig) -> bool:
    """Before a node is built: keep the open-file limit, configure logging (its file bounded
    on disk, ``exo_p2p.logs.rotation``). False, with the reason printed, when the log file
    cannot be written."""
    guard_setrlimit()  # first: no import may lower the open-file limit (exo_p2p.limits)
    try:
        configure_logging(config.log_format, config.log_level, node_name=config.friendly_name or host_name(), log_file=config.log_file)
    except OSError as exc:
        print(f"error: cannot write the log file {config.log_file}: {exc.strerror or exc}", file=sys.stderr)
        return False
    if config.log_file is not None:
        log_rotation.watch(Path(config.log_file))  # bounded on disk (exo_p2p.logs.rotation)
    return True


def run_process(config: NodeConfig, build: Callable[[NodeConfig], RunnableNode]) -> int:
    """Run the node ``build(config)`` gives until SIGINT/SIGTERM; runners are shut down on
    the way out. Returns the process exit code (0 on a clean stop, 1 when the node could not
    start or gave up, the reason reported on one line)."""
    if not prepare_process(config):
        return 1
    try:
        lock = check_can_start(config)
    except StartupError as exc:
        report_error(str(exc))
        return 1
    keep_nofile("node")
    try:
        node = build(config)
    except OSError as exc:
        report_error(str(exc))
        lock.close()
        return 1
    try:
        trio.run(run_until_signal, node)
    except OSError as exc:
        report_error(str(exc))
        return 1
    except BaseExceptionGroup as group:  # noqa: F821 - Python 3.11 builtin
        oserrors, rest = group.split(OSError)
        if rest is None and oserrors is not None:
            report_error(str(first_leaf(oserrors)))
            return 1
        raise
    finally:
        node.close()
        lock.close()
    if node.exit_reason:
        report_error(node.exit_reason)
        return 1
    return 0
