"""``exo_p2p.cli.node_api.http_transport.StdlibTransport`` against small servers on 127.0.0.1: one
kept-alive connection for several calls, a streamed body read as it arrives, and the
standard library's failures raised as httpx's (what ``NodeClient`` catches)."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from exo_p2p.cli.node_api.http_transport import StdlibTransport

pytestmark = pytest.mark.integration


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    peers: list[int] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        type(self).peers.append(self.client_address[1])
        if self.path == "/slow":
            time.sleep(1.0)
        if self.path == "/stream":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for i in range(3):
                self.wfile.write(f"data: {i}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.2)
            return
        body = f'{{"path": "{self.path}"}}'.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        data = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(201)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server():
    _Handler.peers = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def test_calls_share_one_connection_and_bodies_arrive(server) -> None:
    with httpx.Client(base_url=server, transport=StdlibTransport(), timeout=5) as http:
        assert http.get("/a", params={"x": "1 2"}).json() == {"path": "/a?x=1+2"}
        assert http.get("/b").json() == {"path": "/b"}
        posted = http.post("/p", json={"model": "m"})
        assert posted.status_code == 201 and posted.json() == {"model": "m"}
    assert len(set(_Handler.peers)) == 1  # kept alive


def test_a_stream_is_read_as_it_arrives(server) -> None:
    arrived = []
    with httpx.Client(base_url=server, transport=StdlibTransport(), timeout=5) as http:
        with http.stream("GET", "/stream") as response:
            for line in response.iter_lines():
                if line:
                    arrived.append((line, time.monotonic()))
    assert [line for line, _ in arrived] == ["data: 0", "data: 1", "data: 2"]
    assert arrived[-1][1] - arrived[0][1] >= 0.3  # not all at the end


def test_failures_are_httpx_errors(server) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    with pytest.raises(httpx.ConnectError, match="refused"):
        httpx.Client(transport=StdlibTransport()).get(f"http://127.0.0.1:{closed}/")
    with pytest.raises(httpx.ReadTimeout):
        httpx.Client(transport=StdlibTransport(), timeout=httpx.Timeout(0.3, connect=5)).get(f"{server}/slow")
    with socket.socket() as listener:  # answers, but not HTTP (a libp2p port)
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def garbage() -> None:
            conn, _ = listener.accept()
            conn.sendall(b"/multistream/1.0.0\n")
            conn.close()

        thread = threading.Thread(target=garbage)
        thread.start()
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.Client(transport=StdlibTransport(), timeout=5).get(f"http://127.0.0.1:{listener.getsockname()[1]}/")
        thread.join(timeout=5)
