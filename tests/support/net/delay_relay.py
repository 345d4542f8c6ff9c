"""A transparent TCP relay that delays what it forwards: latency for LAN-shaped tests, where the
kernel has ``tbf`` but not ``netem`` (docs/links.md, tests/test_links_netns.py).

Run inside a router namespace whose PREROUTING sends every TCP connection to ``--port``
(``iptables -t nat -A PREROUTING -p tcp -j REDIRECT --to-ports PORT``): each accepted
connection is opened again to its original destination (``SO_ORIGINAL_DST``), and every chunk
read is written on the other side ``--delay`` seconds after it arrived, in order (one thread
per direction; the chunks in between wait in a queue, so bandwidth is not throttled, only
delayed). Test-only; it stops with its process (SIGTERM).

The kernel completes the client's connection to the relay before the relay dials the
destination, so a destination that refuses (nothing listens yet) cannot refuse the client's
connect. A client that dials before its peer listens and retries on refusal (MLX's ring: ranks
≥ 1 retry for ~30 s, ``worker.engine.distributed``) would instead hold a connection the relay
closes, and wedge until its ring-init bound (45 s; seen in ``tests/test_links_netns.py``). So a
refused destination is dialled again every ``RETRY_PAUSE`` s for ``RETRY_FOR`` s, the client's
connection held open meanwhile, as the client's own retries would have done.
"""

from __future__ import annotations

import argparse
import queue
import socket
import struct
import threading
import time

SO_ORIGINAL_DST = 80
RETRY_FOR = 30.0
"""Seconds a refused destination is dialled again (MLX's ring connect retries for ~30 s)."""
RETRY_PAUSE = 0.1
"""Seconds between two dials of a refused destination."""


def original_destination(conn: socket.socket) -> tuple[str, int]:
    raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack_from("!2xH4s", raw)
    return socket.inet_ntoa(packed), port


def pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
    """Forward src → dst, each chunk ``delay`` s after it was read."""
    chunks: queue.Queue[tuple[float, bytes]] = queue.Queue()

    def writer() -> None:
        while True:
            at, data = chunks.get()
            if not data:
                break
            wait = at + delay - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                dst.sendall(data)
            except OSError:
                break
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    while True:
        try:
            data = src.recv(1 << 16)
        except OSError:
            data = b""
        chunks.put((time.monotonic(), data))
        if not data:
            break
    thread.join()


def dial(dest: tuple[str, int]) -> socket.socket:
    """A connection to ``dest``, dialled again while refused for ``RETRY_FOR`` s (module doc).
    Raises ``OSError`` when it cannot be had."""
    deadline = time.monotonic() + RETRY_FOR
    while True:
        try:
            out = socket.create_connection(dest, timeout=5)
            out.settimeout(None)
            return out
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(RETRY_PAUSE)


def serve(conn: socket.socket, delay: float) -> None:
    try:
        out = dial(original_destination(conn))
    except OSError:
        conn.close()
        return
    for s in (conn, out):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=pump, args=(out, conn, delay), daemon=True)
    back.start()
    pump(conn, out, delay)
    back.join()
    conn.close()
    out.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, required=True, help="seconds added to each direction")
    args = parser.parse_args()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", args.port))
    listener.listen(128)
    print("relay ready", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn, args.delay), daemon=True).start()


if __name__ == "__main__":
    main()
