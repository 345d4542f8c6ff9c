"""Two hosts of the network layer on loopback."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from exo_p2p.net import NetConfig, load_or_create_identity


def run(fn, *args, limit: float = 60.0):  # type: ignore[no-untyped-def]
    """Run an async test body under trio with a hard time bound."""

    async def bounded():  # type: ignore[no-untyped-def]
        with trio.fail_after(limit):
            return await fn(*args)

    return trio.run(bounded)


def config(tmp: Path, name: str, **kw) -> NetConfig:  # type: ignore[no-untyped-def]
    return NetConfig(identity=load_or_create_identity(tmp / name), **kw)


async def wait_connected(net, peer: str, limit: float = 10.0) -> float:  # type: ignore[no-untyped-def]
    """Seconds until ``peer`` is connected to ``net``."""
    start = time.monotonic()
    with trio.fail_after(limit):
        while peer not in net.connected_peers():
            await trio.sleep(0.005)
    return time.monotonic() - start
