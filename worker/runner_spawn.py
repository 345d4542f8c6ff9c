"""A runner process and its pipes: started, and its fds 1/2 relayed (``worker.supervisor``).

The runner is ``python -m worker.runner.main --in-fd N --out-fd M``: tasks go to it on one
pipe, its messages come back on another (``worker.runner.protocol``), and its stdout and
stderr are a third pipe whose bytes the supervisor feeds to an ``OutputRelay``
(``worker.runner_output``). The node's log settings reach the runner in its environment
(``exo_p2p.logs.configure.RUNNER_LOG_ENV``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping

import trio

from worker.runner_output import OutputRelay


async def spawn_runner(env: Mapping[str, str] | None, output_fd: int | None
                       ) -> tuple[trio.Process, trio.lowlevel.FdStream, trio.lowlevel.FdStream]:
    """Start a runner with ``env`` (None: the node's own), its fds 1 and 2 on ``output_fd``:
    the process, the stream that sends it tasks and the stream its messages come on. Raises
    ``OSError`` when the process cannot start (no pipe is left open then)."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    try:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "worker.runner.main", "--in-fd", str(in_r), "--out-fd", str(out_w)],
            pass_fds=(in_r, out_w),
            stdin=subprocess.DEVNULL,
            stdout=output_fd,
            stderr=output_fd,
            env=env,
        )
    except BaseException:
        os.close(in_w)
        os.close(out_r)
        raise
    finally:
        os.close(in_r)
        os.close(out_w)
    return process, trio.lowlevel.FdStream(in_w), trio.lowlevel.FdStream(out_r)


def runner_log_settings(env: Mapping[str, str] | None) -> dict:
    """What the node told its runners of its log (``RUNNER_LOG_ENV`` in ``env``, None: the
    node's environment): ``format``, ``node``...; {} when absent or not a JSON object."""
    from exo_p2p.logs.configure import RUNNER_LOG_ENV

    try:
        settings = json.loads((env if env is not None else os.environ).get(RUNNER_LOG_ENV) or "{}")
    except ValueError:
        return {}
    return settings if isinstance(settings, dict) else {}


async def relay_to_log(stream: trio.lowlevel.FdStream, env: Mapping[str, str] | None,
                       fields: dict[str, object], on_line: Callable[[str], None]) -> None:
    """Relay what arrives on ``stream`` (a runner's fds 1/2; the runner's environment ``env``)
    to the node's log through an ``OutputRelay`` (JSON lines carrying ``fields`` and the node's
    name when the node logs JSON, unchanged lines otherwise; every line shown to ``on_line``)
    until end of file or a read error; then close both."""
    from exo_p2p.logs.configure import log_stream

    def write(line: str) -> None:
        out = log_stream()
        out.write(line)
        out.flush()

    settings = runner_log_settings(env)
    fields = {**fields, "node": settings.get("node")}
    relay = OutputRelay(write, {k: v for k, v in fields.items() if v is not None},
                        raw=settings.get("format") != "json", on_line=on_line)
    try:
        while True:
            try:
                data = await stream.receive_some(1 << 16)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            if not data:
                return
            relay.feed(data)
    finally:
        relay.close()
        with trio.CancelScope(shield=True):
            await stream.aclose()
