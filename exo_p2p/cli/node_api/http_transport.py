"""``StdlibTransport``: the CLI's httpx transport, on the standard library's ``http.client``.

httpx's own transport imports httpcore, which imports trio (and anyio) whenever they are
installed — they are, for the node — costing a client command about 0.2 s of CPU before it
sends a byte (docs/cli.md). A CLI command makes a few plain HTTP/1.1 calls to one
node, so this transport is enough: one kept-alive connection per host, the request's
connect / read timeouts (``httpx.Timeout``), responses streamed in chunks (a chat's SSE),
and the standard library's errors mapped to httpx's (``ConnectError``, ``ConnectTimeout``,
``ReadTimeout``, ``RemoteProtocolError``, ``ReadError``) so callers see httpx's exceptions
only. ``https`` URLs use the default SSL context (certificates verified).
"""

from __future__ import annotations

import http.client
import socket
import ssl
from collections.abc import Iterator

import httpx

CHUNK_BYTES = 65_536
"""Bytes read from a response at a time."""


class _Body(httpx.SyncByteStream):
    """A response body read from ``response`` as it arrives; closing it frees the connection
    (or drops it when the body was not read to its end)."""

    def __init__(self, transport: StdlibTransport, key: tuple[str, str, int], conn: http.client.HTTPConnection,
                 response: http.client.HTTPResponse) -> None:
        self._transport, self._key, self._conn, self._response = transport, key, conn, response

    def __iter__(self) -> Iterator[bytes]:
        while True:
            try:
                chunk = self._response.read1(CHUNK_BYTES)
            except (TimeoutError, socket.timeout) as e:
                raise httpx.ReadTimeout(str(e) or "timed out") from e
            except (http.client.HTTPException, OSError) as e:
                raise httpx.ReadError(str(e) or type(e).__name__) from e
            if not chunk:
                return
            yield chunk

    def close(self) -> None:
        done = self._response.isclosed() or self._response.length == 0
        self._response.close()
        if done and not self._response.will_close:
            self._transport._idle[self._key] = self._conn
        else:
            self._conn.close()


class StdlibTransport(httpx.BaseTransport):
    """A synchronous httpx transport over ``http.client`` (module docstring)."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, str, int], http.client.HTTPConnection] = {}

    def _connection(self, url: httpx.URL, timeout: dict) -> tuple[tuple[str, str, int], http.client.HTTPConnection]:
        port = url.port or (443 if url.scheme == "https" else 80)
        key = (url.scheme, url.host, port)
        conn = self._idle.pop(key, None)
        if conn is None:
            connect = timeout.get("connect")
            if url.scheme == "https":
                conn = http.client.HTTPSConnection(url.host, port, timeout=connect, context=ssl.create_default_context())
            else:
                conn = http.client.HTTPConnection(url.host, port, timeout=connect)
            try:
                conn.connect()
            except (TimeoutError, socket.timeout) as e:
                raise httpx.ConnectTimeout(str(e) or "timed out") from e
            except OSError as e:
                raise httpx.ConnectError(str(e) or type(e).__name__) from e
        if conn.sock is not None:
            conn.sock.settimeout(timeout.get("read"))
        return key, conn

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` and return its response with the body still to read. Raises
        httpx's transport errors (module docstring)."""
        key, conn = self._connection(request.url, request.extensions.get("timeout") or {})
        target = request.url.raw_path.decode("ascii")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        try:
            conn.putrequest(request.method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                conn.putheader(name, value)
            conn.endheaders(request.read() or None)
            response = conn.getresponse()
        except (TimeoutError, socket.timeout) as e:
            conn.close()
            raise httpx.ReadTimeout(str(e) or "timed out") from e
        except (http.client.RemoteDisconnected, http.client.BadStatusLine, http.client.LineTooLong) as e:
            conn.close()
            raise httpx.RemoteProtocolError(str(e) or type(e).__name__) from e
        except (http.client.HTTPException, OSError) as e:
            conn.close()
            raise httpx.ReadError(str(e) or type(e).__name__) from e
        return httpx.Response(response.status, headers=response.getheaders(),
                              stream=_Body(self, key, conn, response), extensions={"http_version": b"HTTP/1.1"})

    def close(self) -> None:
        for conn in self._idle.values():
            conn.close()
        self._idle.clear()
