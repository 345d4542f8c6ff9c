"""``serve``: run an ASGI app with hypercorn's trio worker inside the caller's nursery."""

from __future__ import annotations

import errno
import logging
import socket
from typing import Any

import trio
from hypercorn.config import Config, Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app
from starlette.types import ASGIApp

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


class _BoundPort:
    """Adapts hypercorn's ``started(list_of_urls)`` to ``started(port)`` of the caller."""

    def __init__(self, task_status: trio.TaskStatus[int], port: int) -> None:
        self.task_status = task_status
        self.port = port

    def started(self, binds: Any = None) -> None:
        self.task_status.started(self.port)


async def serve(
    app: ASGIApp,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    shutdown_event: trio.Event | None = None,
    graceful_timeout: float = 3.0,
) -> None:
    """Serve ``app`` over HTTP on ``host:port`` until ``shutdown_event`` is set or the
    caller's scope is cancelled; use with ``await nursery.start(serve, app, host, port)``,
    which returns the bound TCP port (with ``port=0``, the port the OS chose).

    Binding happens before ``started``: a failure raises ``ApiBindError`` (an ``OSError``)
    with a message such as "port 52515 on 127.0.0.1 is in use". Access logs are off;
    hypercorn's own messages go to the ``exo_p2p.api.server`` logger. On shutdown, open
    connections get ``graceful_timeout`` seconds to finish, then are cancelled (streams
    in progress end; their generations are cancelled by the API).
    """
    config = Config()
    config.accesslog = None
    config.errorlog = logging.getLogger(SERVER_LOGGER)
    config.graceful_timeout = graceful_timeout
    try:
        sock = listen_socket(host, port)
    except OSError as exc:
        raise ApiBindError(exc.errno, bind_error_message(host, port, exc)) from None
    sockets = Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])
    trigger = shutdown_event.wait if shutdown_event is not None else None
    try:
        sock.listen(config.backlog)
        bound_port = sock.getsockname()[1]
        await worker_serve(
            wrap_app(app, config.wsgi_max_body_size, "asgi"),
            config,
            sockets=sockets,
            shutdown_trigger=trigger,
            task_status=_BoundPort(task_status, bound_port),  # type: ignore[arg-type]
        )
    finally:
        sock.close()
