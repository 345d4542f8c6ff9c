"""Client commands start fast: importing the CLI, ``--help`` (of the app and of every
command) and a client command that finds no node load neither py-libp2p, MLX, the
tokenizer libraries nor the node (each is seconds of import on a busy machine; only
``node``, ``invite`` and the join handling need them, and import them when they run).

Each check runs in a fresh interpreter (a subprocess: the test process itself has long
imported everything) and reads that interpreter's ``sys.modules`` at the end.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

FORBIDDEN = ("libp2p", "multiaddr", "mlx", "mlx_lm", "transformers", "tokenizers", "numpy",
             "exo_p2p.node", "exo_p2p.net", "master", "worker", "trio", "anyio", "httpcore", "structlog")
"""Top-level packages (and exo-p2p modules) a client command must not import. trio, anyio
and httpcore too: httpx's own transport imports httpcore, which imports trio and anyio
whenever they are installed (~0.2 s of CPU); the CLI sends through
``exo_p2p.cli.node_api.http_transport`` instead. structlog: only a node (or ``run`` starting one)
logs through it."""

PROBE = r"""
import json, sys
argvs = json.loads(sys.argv[1])
if argvs is None:
    import exo_p2p.cli.main
else:
    from exo_p2p.cli.main import app
    for argv in argvs:
        try:
            app(args=argv, prog_name="exo-p2p")
        except SystemExit:
            pass
print("MODULES=" + json.dumps(sorted(sys.modules)))
"""


def loaded_modules(argvs: list[list[str]] | None) -> list[str]:
    """The modules a fresh interpreter holds after importing the CLI (``argvs`` None) or
    after running each command line of ``argvs`` through the app."""
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs)], capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "COLUMNS": "100", "EXO_P2P_HOME": "/nonexistent-exo-p2p-home"})
    assert out.returncode == 0, out.stderr
    line = next(li for li in out.stdout.splitlines() if li.startswith("MODULES="))
    return json.loads(line.removeprefix("MODULES="))


def forbidden_in(modules: list[str]) -> list[str]:
    """The modules of ``modules`` under a ``FORBIDDEN`` name."""
    return [m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def client_commands() -> list[str]:
    from exo_p2p.cli.main import app
    import typer.main

    return sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def test_importing_the_cli_loads_no_node_library() -> None:
    modules = loaded_modules(None)
    assert "exo_p2p.cli.main" in modules
    assert forbidden_in(modules) == []
    assert "trio" not in modules  # before any request, not even httpcore's


def test_help_of_every_command_loads_no_node_library() -> None:
    commands = client_commands()
    assert {"node", "models", "ps", "chat", "invite"} <= set(commands)
    modules = loaded_modules([["--help"], *([c, "--help"] for c in commands)])
    assert forbidden_in(modules) == []
    assert "trio" not in modules


def test_client_commands_against_a_node_load_no_node_library() -> None:
    """Commands that reach an API (the CLI tests' fake node) and print what it answered."""
    from tests.support.fake_node import Served

    served = Served()
    try:
        argvs = [["models", "--api", served.url], ["instances", "--api", served.url], ["nodes", "--api", served.url],
                 ["place", "smollm2-135m-instruct", "--no-wait", "--api", served.url], ["ps", "--api", served.url],
                 ["chat", "hi", "-m", "smollm2-135m-instruct", "--api", served.url]]
        modules = loaded_modules(argvs)
    finally:
        served.close()
    assert "exo_p2p.cli.node_api.http_transport" in modules and forbidden_in(modules) == []


def test_client_commands_without_a_node_load_no_node_library() -> None:
    api = f"http://127.0.0.1:{closed_port()}"
    argvs = [["models", "--api", api], ["ps", "--api", api], ["nodes", "--json", "--api", api],
             ["chat", "hi", "--api", api], ["stop", "m", "--api", api], ["rm", "m", "--api", api]]
    assert forbidden_in(loaded_modules(argvs)) == []


CLIENT_CPU_SECONDS = 0.8
"""The most CPU (user + system, seconds) a client command may take here: docs/cli.md states
about 0.3 s (measured on a loaded 2-core machine with bytecode cached); 0.8 leaves room for a
shared, loaded CI machine and stays below the 0.9-1.5 s that commands cost when they imported
the node's libraries."""


def cpu_seconds(argv: list[str]) -> float:
    """User + system CPU seconds of one ``python -m exo_p2p ARGV`` run to its end (exit 0)."""
    import os
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "100", "EXO_P2P_HOME": "/nonexistent-exo-p2p-home"}
    env.update({k: v for k, v in os.environ.items() if k in ("HOME", "LANG")})  # bytecode written and read, as a user's
    out = subprocess.run([sys.executable, "-m", "exo_p2p", *argv], capture_output=True, text=True, timeout=120, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert out.returncode == 0, out.stderr
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def test_a_client_command_costs_a_fraction_of_a_second_of_cpu() -> None:
    """``models``, ``instances``, ``nodes`` against a node, and ``--help``: the least CPU of
    three runs each (the first may write bytecode; the others show the load's noise) is
    under ``CLIENT_CPU_SECONDS``."""
    from tests.support.fake_node import Served

    served = Served()
    try:
        figures = {" ".join(argv): min(cpu_seconds(argv) for _ in range(3))
                   for argv in (["models", "--api", served.url], ["instances", "--api", served.url],
                                ["nodes", "--api", served.url], ["--help"])}
    finally:
        served.close()
    print(f"client command CPU seconds: {figures}")
    assert max(figures.values()) <= CLIENT_CPU_SECONDS, figures
