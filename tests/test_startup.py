"""Start-up checks of a node (``exo_p2p.node.process.check_can_start``): a port taken by a live
listener is refused with a one-line reason; a port whose only sockets are connections of a
node that just died (TIME_WAIT) is not — a node restarted right after a crash must start
(found by scripts/chaos.py: a SIGKILLed node with open API clients could not be restarted on
its port for a minute)."""

from __future__ import annotations

import socket

import pytest

from exo_p2p.config import NodeConfig
from exo_p2p.node.process import StartupError, check_can_start


def _config(tmp_path, port: int) -> NodeConfig:
    return NodeConfig(data_dir=tmp_path / "data", api_host="127.0.0.1", api_port=port, listen_host="127.0.0.1", listen_port=0)


def _time_wait_port() -> int:
    """A loopback port with a server-side connection in TIME_WAIT and no listener left: the
    server accepts a connection and closes it first (the active closer keeps TIME_WAIT)."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn, _ = listener.accept()
    conn.close()  # server closes first -> TIME_WAIT on 127.0.0.1:port
    client.recv(1)  # sees EOF
    client.close()
    listener.close()
    return port


@pytest.mark.integration
def test_port_left_in_time_wait_by_a_dead_node_does_not_block_a_restart(tmp_path):
    port = _time_wait_port()
    with socket.socket() as plain:  # without SO_REUSEADDR the bind fails: the case is real
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))
    lock = check_can_start(_config(tmp_path, port))
    lock.close()


@pytest.mark.integration
def test_port_with_a_live_listener_is_refused_with_a_clear_message(tmp_path):
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(StartupError) as info:
            check_can_start(_config(tmp_path, port))
    assert f"API port {port} on 127.0.0.1 is not available" in str(info.value)
    assert "--api-port" in str(info.value)


def test_second_node_on_the_same_data_dir_is_refused(tmp_path):
    lock = check_can_start(_config(tmp_path, 0))
    try:
        with pytest.raises(StartupError, match="is using the data dir"):
            check_can_start(_config(tmp_path, 0))
    finally:
        lock.close()
