"""Throughput of fetching a model shard over the cluster's libp2p streams vs a plain TCP copy.

One run, on this machine: a ~``--mb`` MB synthetic shard file (seeded random bytes) in a temp
dir; ``--sources`` holder processes (each one libp2p host serving ``CHUNK_PROTOCOL`` from that
file, and a plain TCP server sending the same bytes); the fetching side runs in this process:

1. plain TCP: read the whole file from one holder's socket into a file, fsync (the baseline);
2. libp2p stream, 1 source: ``fetch_chunks`` (verified chunks, partial file, journal) from
   holder 1 over ``CHUNK_PROTOCOL``; then from holders 1 and 2 at once (``--sources 2``);
3. bulk path (``exo_p2p.models.transfer.bulk``: a ticket over libp2p, bytes over TCP, verified the same
   way), 1 source, then 2.

Prints each throughput (MB/s) and the ratios to TCP and 2 sources ÷ 1. Target
(docs/models.md): libp2p ÷ TCP ≥ 0.5. ``--secret`` runs the hosts in a private network (PSK), as a node
with ``--cluster-secret`` does.

    .venv/bin/python scripts/bench_transfer.py --mb 512 --sources 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import numpy as np
import structlog
import trio

from exo_p2p.models.transfer.bulk import BulkServer
from exo_p2p.models.transfer.bulk_client import bulk_chunk_getter
from exo_p2p.models.transfer.chunk_sets import shard_chunks
from exo_p2p.models.transfer.fetch import FetchLimits, fetch_chunks
from exo_p2p.models.manifest import MAX_CHUNK_BYTES, build_manifest
from exo_p2p.models.copies.partial import PartialModel
from exo_p2p.models.transfer.protocols import LocalModel, ModelServer, chunk_getter
from exo_p2p.net import NetConfig, load_or_create_identity, open_host
from exo_p2p.types.manifest import ModelManifest

SECRET = bytes(range(32))


def _write_shard(model_dir: Path, mb: int) -> None:
    model_dir.mkdir(parents=True)
    rng = np.random.default_rng(7)
    with open(model_dir / "shard.bin", "wb") as f:
        for _ in range(mb):
            f.write(rng.bytes(1 << 20))


async def _holder(args: argparse.Namespace) -> None:
    """A holder process: serve the model dir over libp2p and over a plain TCP socket."""
    model_dir = Path(args.model_dir)
    manifest = msgspec.json.decode(Path(args.manifest).read_bytes(), type=ModelManifest)
    config = NetConfig(identity=load_or_create_identity(Path(args.data_dir)), listen_host="127.0.0.1",
                       listen_port=0, cluster="bench-transfer",
                       cluster_secret=SECRET if args.secret else None, mdns=False)
    source = LocalModel(model_dir, manifest)
    server = ModelServer(lambda d: source if d == manifest.digest else None)
    bulk = BulkServer(lambda d: source if d == manifest.digest else None)
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    async def serve_tcp() -> None:
        while True:
            conn, _ = await listener.accept()
            with conn, open(model_dir / "shard.bin", "rb") as f:
                while block := f.read(MAX_CHUNK_BYTES):
                    view = memoryview(block)
                    while view:
                        view = view[await conn.send(view):]

    with trio.move_on_after(args.lifetime):
        async with open_host(config) as net, trio.open_nursery() as nursery:
            server.register(net)
            bulk.register(net)
            await nursery.start(bulk.run, ["127.0.0.1"])
            nursery.start_soon(serve_tcp)
            print(json.dumps({"addrs": net.listen_addrs(), "node_id": net.node_id,
                              "tcp_port": listener.getsockname()[1]}), flush=True)
            await trio.sleep_forever()


def _tcp_copy(port: int, out: Path, size: int) -> float:
    """Seconds to receive ``size`` bytes from ``port`` into ``out`` (fsync included)."""
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as s, open(out, "wb") as f:
        got = 0
        buf = bytearray(MAX_CHUNK_BYTES)
        view = memoryview(buf)
        while got < size:
            n = s.recv_into(view)
            if not n:
                break
            f.write(view[:n])
            got += n
        f.flush()
        os.fsync(f.fileno())
    assert got == size, f"tcp copy got {got} of {size} bytes"
    return time.perf_counter() - start


async def _fetch(args, manifest: ModelManifest, holders: list[dict], out: Path, bulk: bool) -> tuple[float, dict]:
    config = NetConfig(identity=load_or_create_identity(out.parent / f"id-{out.name}"), listen_host="127.0.0.1",
                       listen_port=0, cluster="bench-transfer",
                       cluster_secret=SECRET if args.secret else None, mdns=False)
    async with open_host(config) as net:
        peers = [await net.dial(h["addrs"][0], timeout=10) for h in holders]
        wanted = shard_chunks(manifest, start_layer=0, end_layer=1, n_layers=1, tied=False)
        limits = FetchLimits(streams_per_peer=args.streams, chunk_timeout=30.0)
        start = time.perf_counter()
        close = None
        if bulk:
            get, close = bulk_chunk_getter(net, manifest.digest, timeout=30.0)
        else:
            get = chunk_getter(net, manifest.digest, timeout=30.0)
        with PartialModel(out, manifest) as partial:
            report = await fetch_chunks(partial, wanted, peers, get, limits=limits)
            assert partial.complete
        if close is not None:
            await close()
        return time.perf_counter() - start, report.bytes_by_peer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=512, help="shard size in MiB (default 512)")
    parser.add_argument("--sources", type=int, default=2, choices=(1, 2))
    parser.add_argument("--streams", type=int, default=2, help="concurrent streams per holder")
    parser.add_argument("--secret", action="store_true", help="PSK private network, like --cluster-secret")
    parser.add_argument("--holder", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--manifest", help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)
    parser.add_argument("--lifetime", type=float, default=600.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    import logging

    logging.getLogger("libp2p").setLevel(logging.CRITICAL)
    if args.holder:
        trio.run(_holder, args)
        return
    with tempfile.TemporaryDirectory(prefix="bench-transfer-") as tmp:
        root = Path(tmp)
        model_dir = root / "model"
        _write_shard(model_dir, args.mb)
        t0 = time.perf_counter()
        manifest = build_manifest(model_dir, "bench", chunk_bytes=MAX_CHUNK_BYTES)
        hash_s = time.perf_counter() - t0
        (root / "manifest.json").write_bytes(msgspec.json.encode(manifest))
        size = manifest.total_bytes
        procs, holders = [], []
        try:
            for i in range(args.sources):
                cmd = [sys.executable, __file__, "--holder", "--model-dir", str(model_dir),
                       "--manifest", str(root / "manifest.json"), "--data-dir", str(root / f"holder{i}")]
                if args.secret:
                    cmd.append("--secret")
                p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
                procs.append(p)
                holders.append(json.loads(p.stdout.readline()))
            # the baseline is the best of two copies (the machine is shared: a slow one would flatter us)
            tcp_s = min(_tcp_copy(holders[0]["tcp_port"], root / "tcp.bin", size) for _ in range(2))
            (root / "tcp.bin").unlink()
            mb = size / 1e6
            print(f"shard {mb:.0f} MB, chunks of {MAX_CHUNK_BYTES >> 20} MiB, {args.streams} streams/holder"
                  f"{', PSK' if args.secret else ''}; manifest hashing {mb / hash_s:.0f} MB/s")
            print(f"plain TCP copy            : {mb / tcp_s:8.1f} MB/s")
            for label, bulk in (("libp2p stream", False), ("bulk (ticket)", True)):
                one_s, _ = trio.run(_fetch, args, manifest, holders[:1], root / "fetch1", bulk)
                shutil.rmtree(root / "fetch1")
                print(f"{label}, 1 source   : {mb / one_s:8.1f} MB/s   ratio to TCP {tcp_s / one_s:.2f} (target >= 0.5)")
                if args.sources == 2:
                    two_s, by_peer = trio.run(_fetch, args, manifest, holders, root / "fetch2", bulk)
                    shutil.rmtree(root / "fetch2")
                    split = ", ".join(f"{v / 1e6:.0f} MB" for v in by_peer.values())
                    print(f"{label}, 2 sources  : {mb / two_s:8.1f} MB/s   ratio to 1 source {one_s / two_s:.2f} ({split})")
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


if __name__ == "__main__":
    main()
