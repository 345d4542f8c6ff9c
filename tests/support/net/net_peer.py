"""A subprocess peer for tests/test_net.py: one exo_p2p.net host until killed.

Prints JSON lines on stdout: {"event": "up", "node_id", "addrs"} once listening, then
{"event": "peer", "peer", "connected"} for each peer change. Serves "/echo/1" (reply = request)
and subscribes to topic "t". Exits by itself after --lifetime seconds (a bound, so a test that
forgets it cannot leave it running forever).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import structlog
import trio

from exo_p2p.net import NetConfig, load_or_create_identity, open_host


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main(args: argparse.Namespace) -> None:
    identity = load_or_create_identity(Path(args.data_dir))
    config = NetConfig(
        identity=identity,
        listen_host=args.listen_host,
        listen_port=args.port,
        cluster=args.cluster,
        cluster_secret=bytes.fromhex(args.secret) if args.secret else None,
        bootstrap=tuple(args.bootstrap),
        mdns=args.mdns,
    )
    with trio.move_on_after(args.lifetime):
        async with open_host(config) as net:

            async def echo(peer: str, data: bytes) -> bytes:
                return data

            net.set_request_handler("/echo/1", echo)
            events = net.peer_events()
            await net.subscribe("t")
            _emit({"event": "up", "node_id": net.node_id, "addrs": net.listen_addrs()})
            async for peer, connected in events:
                _emit({"event": "peer", "peer": peer, "connected": connected})


if __name__ == "__main__":
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--listen-host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cluster", default="default")
    parser.add_argument("--secret", default="")
    parser.add_argument("--bootstrap", action="append", default=[])
    parser.add_argument("--mdns", action="store_true")
    parser.add_argument("--lifetime", type=float, default=120.0)
    trio.run(main, parser.parse_args())
