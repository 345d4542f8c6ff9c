"""A hostile libp2p peer for fault tests, driven over stdin/stdout (one JSON object a line).

Run as ``python -m tests.support.net.rogue_peer --data-dir D --bootstrap ADDR``. It opens an
``exo_p2p.net`` host (its own identity, so it can only sign as itself), dials the bootstrap
node, subscribes to the cluster's gossip topics (so it is in their mesh) and then executes
the operations the test writes on stdin, answering each with one JSON line on stdout:

- ``{"op": "ping"}`` → ``{"ok": true, "node_id": ..., "peers": [...]}``
- ``{"op": "publish", "topic": T, "hex": H}`` → hand the raw bytes to pubsub directly
  (bypassing ``Network.publish``'s size check, so oversized messages really go out).
- ``{"op": "request", "peer": P, "protocol": R, "hex": H, "timeout": s}`` → a framed
  request as a normal node sends it; ``{"ok": true, "reply_hex": ...}`` or
  ``{"ok": false, "error": ...}``.
- ``{"op": "raw_stream", "peer": P, "protocol": R, "hex": H, "hold": s}`` → open a stream,
  write the raw bytes (no framing; may be empty), then read until the stream ends or
  ``hold`` seconds pass; answers ``{"ended": "eof"|"reset"|"timeout", "got_hex": ...,
  "after_s": ...}``.
- ``{"op": "batch", "ops": [...]}`` → run the operations concurrently; ``{"results": [...]}``.
- ``{"op": "quit"}`` → exits.

Every operation is bounded by its own timeout and the whole process by ``--lifetime``
seconds, so a test that forgets it cannot leave it running.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import structlog
import trio

from exo_p2p.net import NetConfig, load_or_create_identity, open_host

TOPICS = ("exo-p2p/heartbeats/1", "exo-p2p/local-events/1", "exo-p2p/global-events/1")


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def _raw_stream(net, peer: str, protocol: str, data: bytes, hold: float) -> dict:
    from libp2p.custom_types import TProtocol
    from libp2p.peer.id import ID

    host = net._host
    start = trio.current_time()
    got = bytearray()
    ended = "timeout"
    with trio.move_on_after(hold + 5):
        stream = await host.new_stream(ID.from_base58(peer), [TProtocol(protocol)])
        try:
            if data:
                await stream.write(data)
            with trio.move_on_after(hold):
                while True:
                    try:
                        chunk = await stream.read(65536)
                    except Exception as exc:  # StreamEOF, StreamReset, …
                        ended = "eof" if "EOF" in type(exc).__name__ else "reset"
                        break
                    if not chunk:
                        ended = "eof"
                        break
                    got += chunk
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                try:
                    await stream.reset()
                except Exception:
                    pass
    return {"ended": ended, "got_hex": bytes(got[:4096]).hex(), "after_s": round(trio.current_time() - start, 2)}


async def _handle(net, op: dict) -> dict:
    kind = op.get("op")
    if kind == "ping":
        return {"ok": True, "node_id": net.node_id, "peers": sorted(net.connected_peers())}
    if kind == "publish":
        data = bytes.fromhex(op["hex"])
        await net._pubsub.publish(op["topic"], data)
        return {"ok": True, "bytes": len(data)}
    if kind == "request":
        try:
            reply = await net.request(op["peer"], op["protocol"], bytes.fromhex(op["hex"]), timeout=float(op.get("timeout", 10)))
            return {"ok": True, "reply_hex": reply.hex()}
        except Exception as exc:  # noqa: BLE001 - reported to the test
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    if kind == "raw_stream":
        try:
            return {"ok": True, **await _raw_stream(net, op["peer"], op["protocol"], bytes.fromhex(op.get("hex", "")), float(op.get("hold", 1)))}
        except Exception as exc:  # noqa: BLE001
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    if kind == "batch":
        results: list[dict] = [{} for _ in op["ops"]]

        async def one(i: int, sub: dict) -> None:
            results[i] = await _handle(net, sub)

        async with trio.open_nursery() as nursery:
            for i, sub in enumerate(op["ops"]):
                nursery.start_soon(one, i, sub)
        return {"ok": True, "results": results}
    return {"ok": False, "error": f"unknown op {kind!r}"}


async def main(args: argparse.Namespace) -> None:
    identity = load_or_create_identity(Path(args.data_dir))
    config = NetConfig(identity=identity, listen_host="127.0.0.1", listen_port=0, cluster=args.cluster, bootstrap=tuple(args.bootstrap))
    with trio.move_on_after(args.lifetime):
        async with open_host(config) as net:
            for topic in TOPICS:
                await net.subscribe(topic)
            for addr in args.bootstrap:
                with trio.move_on_after(10):
                    try:
                        await net.dial(addr, timeout=5)
                    except Exception:
                        pass
            _emit({"event": "up", "node_id": net.node_id, "addrs": net.listen_addrs()})
            while True:
                line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
                if not line:
                    return
                try:
                    op = json.loads(line)
                except ValueError:
                    _emit({"ok": False, "error": "bad json"})
                    continue
                if op.get("op") == "quit":
                    _emit({"ok": True})
                    return
                with trio.move_on_after(float(op.get("op_timeout", 60))) as scope:
                    reply = await _handle(net, op)
                if scope.cancelled_caught:
                    reply = {"ok": False, "error": "operation timed out"}
                _emit(reply)


if __name__ == "__main__":
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--cluster", default="default")
    parser.add_argument("--bootstrap", action="append", default=[])
    parser.add_argument("--lifetime", type=float, default=300.0)
    trio.run(main, parser.parse_args())


# --- the test side -------------------------------------------------------------------------------


class RogueProcess:
    """Test-side handle of a rogue peer subprocess: ``start()`` waits until it is up,
    ``call(op, **fields)`` sends one operation and returns its JSON answer (bounded by
    ``timeout`` seconds), ``stop()`` ends it (by its pid) however the test ends."""

    def __init__(self, data_dir: Path, bootstrap: list[str], *, cluster: str = "default", lifetime: float = 300.0) -> None:
        self.data_dir = data_dir
        self.bootstrap = bootstrap
        self.cluster = cluster
        self.lifetime = lifetime
        self.proc = None
        self.node_id = ""
        self._lines = None

    def start(self, timeout: float = 30.0) -> "RogueProcess":
        import os
        import queue
        import subprocess
        import threading

        repo = Path(__file__).resolve().parents[3]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "tests.support.net.rogue_peer", "--data-dir", str(self.data_dir), "--cluster", self.cluster, "--lifetime", str(self.lifetime)]
        for a in self.bootstrap:
            cmd += ["--bootstrap", a]
        err = open(self.data_dir / "rogue.log", "ab")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, cwd=repo, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        self._lines = queue.Queue()

        def pump() -> None:
            for line in self.proc.stdout:
                self._lines.put(line)
            self._lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        up = self._next(timeout)
        self.node_id = up["node_id"]
        return self

    def _next(self, timeout: float) -> dict:
        import queue

        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty as exc:
            raise TimeoutError(f"rogue peer did not answer within {timeout} s") from exc
        if line is None:
            raise RuntimeError(f"rogue peer exited: {(self.data_dir / 'rogue.log').read_text()[-2000:]}")
        return json.loads(line)

    def call(self, op: str, timeout: float = 60.0, **fields) -> dict:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, "op_timeout": timeout - 2, **fields}) + "\n")
        self.proc.stdin.flush()
        return self._next(timeout)

    def publish(self, topic: str, data: bytes) -> dict:
        return self.call("publish", topic=topic, hex=data.hex(), timeout=20)

    def request(self, peer: str, protocol: str, data: bytes, timeout: float = 10.0) -> dict:
        return self.call("request", peer=peer, protocol=protocol, hex=data.hex(), timeout=timeout + 10)

    def raw_stream(self, peer: str, protocol: str, data: bytes, hold: float) -> dict:
        return self.call("raw_stream", peer=peer, protocol=protocol, hex=data.hex(), hold=hold, timeout=hold + 15)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.proc.stdin.write('{"op": "quit"}\n')
            self.proc.stdin.flush()
            self.proc.wait(10)
        except Exception:  # noqa: BLE001 - fall through to kill
            pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
