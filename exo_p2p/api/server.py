"""``serve``: run an ASGI app with hypercorn's HTTP/1.1 protocol on trio inside the caller's
nursery, with bounds on what a client can hold.

The bounds (``server_config`` and ``serve``), so that idle, slow or many clients cost a
bounded number of descriptors and never the node:

- **connections**: at most ``exo_p2p.limits.api_connection_cap`` of the process's soft
  open-file limit at once (4,096 with a limit of 5,452 or more); one beyond is closed on
  arrival (``exo_p2p.listen.accept.serve_bounded``, which also rides out ``EMFILE`` and other
  transient accept errors). The kernel queues at most ``BACKLOG`` connections not accepted yet.
- **a request's head** (request line and headers) must arrive within ``KEEP_ALIVE_TIMEOUT``
  s of the connection's start or of the previous response (hypercorn's keep-alive timer runs
  until a whole head is parsed, so an idle or header-slowloris connection is closed then; an
  HTTP/2 connection, whose first request hypercorn does not time, by ``BoundedTCPServer``) and
  be at most ``MAX_HEAD_BYTES`` (hypercorn's ``h11_max_incomplete_size``; larger: 400, closed).
- **a request's body** must arrive within ``slow_clients.BODY_TIMEOUT`` s of its head (408,
  connection closed; ``exo_p2p.api.slow_clients.BodyDeadline``).
- **a response's bytes**: each write must be taken by the client within ``SEND_TIMEOUT`` s
  (``BoundedTCPServer``; hypercorn's writes have no bound), else the connection is closed: a
  client that asks and never reads is a slowloris too.
- hypercorn's ``read_timeout`` stays off: it bounds every read, also while a client waits
  silently for a long streamed answer, which it would cut.

hypercorn's ``worker_serve`` has no connection cap, so ``serve`` runs its parts (lifespan,
``TCPServer`` per connection, graceful shutdown) around our accept loop instead.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Awaitable, Callable
from functools import partial

import trio
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import wrap_app
from starlette.types import ASGIApp

from exo_p2p.api.slow_clients import BODY_TIMEOUT, BodyDeadline
from exo_p2p.limits import api_connection_cap
from exo_p2p.listen.accept import serve_bounded

SERVER_LOGGER = "exo_p2p.api.server"
"""The stdlib logger hypercorn's own messages go to ("Running on …", protocol errors)."""


class ApiBindError(OSError):
    """The API could not bind its address; ``str()`` says which and why, e.g.
    "port 52515 on 127.0.0.1 is in use". ``errno`` is the original one."""

    def __str__(self) -> str:
        return str(self.strerror)


def bind_error_message(host: str, port: int, exc: OSError) -> str:
    """A one-line reason a bind of ``host:port`` failed, for the node to print."""
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is in use"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {host}:{port}: no interface of this machine has address {host}"
    if exc.errno == errno.EACCES:
        return f"cannot listen on {host}:{port}: permission denied (ports below 1024 need privileges)"
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"


def listen_socket(host: str, port: int) -> socket.socket:
    """A bound, non-blocking TCP socket on ``host:port`` (IPv6 when ``host`` has a colon),
    with ``SO_REUSEADDR`` and ``TCP_NODELAY``, not inherited by child processes (runners).
    Raises ``OSError`` (closing the socket) when the address cannot be bound."""
    host = host.strip("[]")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


KEEP_ALIVE_TIMEOUT = 5.0
"""Seconds a connection may wait for a whole request head (hypercorn's ``keep_alive_timeout``)."""
MAX_HEAD_BYTES = 16 * 1024
"""Bytes of a request line and headers at most (hypercorn's ``h11_max_incomplete_size``)."""
BACKLOG = 1024
"""Connections the kernel queues before they are accepted (``listen`` backlog): a burst of
connections waits there rather than in SYN retries (1 s and more per retry)."""


SEND_TIMEOUT = 20.0
"""Seconds one write of a response may wait for the client to take it (its receive window)."""


class BoundedTCPServer(TCPServer):
    """hypercorn's per-connection server with two more bounds:

    - its writes wait at most ``SEND_TIMEOUT`` s: a client that does not read is closed like
      one that went away (``Closed`` to the protocol, which ends the request; the app's stream
      sees a disconnect). The class attribute ``send_timeout`` is read per write.
    - the connection's first request must reach the app within ``config.keep_alive_timeout``
      s, else the connection is closed. For HTTP/1.1 hypercorn's keep-alive timer does that
      already; an HTTP/2 connection opened with the prior-knowledge preface (``PRI *``) stops
      that timer before it has a stream, and one that then says nothing was held forever.
    """

    send_timeout = SEND_TIMEOUT

    def __init__(self, app, config: Config, context, state, stream) -> None:  # type: ignore[no-untyped-def]
        self.first_request = trio.Event()

        async def app_seen(*args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            self.first_request.set()
            await app(*args, **kwargs)

        super().__init__(app_seen, config, context, state, stream)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._first_request_deadline)
            await super().run()
            nursery.cancel_scope.cancel()

    async def _first_request_deadline(self) -> None:
        with trio.move_on_after(self.config.keep_alive_timeout):
            await self.first_request.wait()
            return
        await self.stream.aclose()  # the reader sees it closed and the connection ends

    async def protocol_send(self, event: Event) -> None:
        if not isinstance(event, RawData):
            await super().protocol_send(event)
            return
        async with self.send_lock:
            try:
                with trio.CancelScope(shield=True):  # as hypercorn: a write is not cut by a cancel
                    with trio.fail_after(self.send_timeout):
                        await self.stream.send_all(event.data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
                await self.stream.aclose()
                await self.protocol.handle(Closed())


def server_config(graceful_timeout: float) -> Config:
    """hypercorn's ``Config`` with the bounds of this module: access log off, error log to
    ``SERVER_LOGGER``, ``graceful_timeout`` seconds for open connections at shutdown."""
    config = Config()
    config.accesslog = None
    config.errorlog = logging.getLogger(SERVER_LOGGER)
    config.graceful_timeout = graceful_timeout
    config.keep_alive_timeout = KEEP_ALIVE_TIMEOUT
    config.h11_max_incomplete_size = MAX_HEAD_BYTES
    config.backlog = BACKLOG
    config.read_timeout = None
    return config


async def serve(
    app: ASGIApp,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    shutdown_event: trio.Event | None = None,
    graceful_timeout: float = 3.0,
    max_connections: int | None = None,
    body_timeout: float = BODY_TIMEOUT,
) -> None:
    """Serve ``app`` over HTTP on ``host:port`` until ``shutdown_event`` is set or the
    caller's scope is cancelled; use with ``await nursery.start(serve, app, host, port)``,
    which returns the bound TCP port (with ``port=0``, the port the OS chose).

    Binding happens before ``started``: a failure raises ``ApiBindError`` (an ``OSError``)
    with a message such as "port 52515 on 127.0.0.1 is in use". Access logs are off;
    hypercorn's own messages go to the ``exo_p2p.api.server`` logger. At most
    ``max_connections`` connections at once (default: ``api_connection_cap`` of the soft
    open-file limit); bodies within ``body_timeout`` s (see the module docstring). On shutdown,
    open connections get ``graceful_timeout`` seconds to finish, then are cancelled (streams
    in progress end; their generations are cancelled by the API).
    """
    import resource

    config = server_config(graceful_timeout)
    if max_connections is None:
        max_connections = api_connection_cap(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    try:
        sock = listen_socket(host, port)
    except OSError as exc:
        raise ApiBindError(exc.errno, bind_error_message(host, port, exc)) from None
    trigger = shutdown_event.wait if shutdown_event is not None else trio.sleep_forever
    wrapped = wrap_app(BodyDeadline(app, body_timeout), config.wsgi_max_body_size, "asgi")
    try:
        sock.listen(config.backlog)
        bound_port = sock.getsockname()[1]
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        await _serve_hypercorn(wrapped, config, listener, max_connections, trigger,
                               lambda: task_status.started(bound_port))
    finally:
        sock.close()


async def _serve_hypercorn(app, config: Config, listener: trio.SocketListener, max_connections: int,  # type: ignore[no-untyped-def]
                           shutdown_trigger: Callable[[], Awaitable[object]], started: Callable[[], None]) -> None:
    """hypercorn's ``trio.run.worker_serve`` for one plain listener, accepting through
    ``serve_bounded``: lifespan start, serve until ``shutdown_trigger`` returns or the scope is
    cancelled, then ``config.graceful_timeout`` s for open connections, lifespan shutdown."""
    config.set_statsd_logger_class(StatsdLogger)
    lifespan_state: dict = {}
    lifespan = Lifespan(app, config, lifespan_state)
    context = WorkerContext(None)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as server_nursery:
            handler = partial(BoundedTCPServer, app, config, context, ConnectionState(lifespan_state.copy()))
            try:
                async with trio.open_nursery() as accepting:
                    await accepting.start(partial(serve_bounded, listener, handler, max_connections=max_connections,
                                                  name="api", handler_nursery=server_nursery))
                    await config.log.info(f"Running on http://{_where(listener)} (CTRL + C to quit)")
                    started()
                    await shutdown_trigger()
                    accepting.cancel_scope.cancel()
            finally:
                await context.terminated.set()
                server_nursery.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


def _where(listener: trio.SocketListener) -> str:
    host, port = listener.socket.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
