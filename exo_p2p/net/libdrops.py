"""Counts of what py-libp2p only logs: silent message drops and peer connection resets.

py-libp2p 0.8.1 only *logs* when it drops a pubsub message: a full outbound per-peer queue
(32 RPCs) or an oversized RPC ("Dropping outbound RPC", debug level), or a full subscription
queue ("fail to deliver message to subscription", warning). ``install()`` attaches a logging
filter to those two loggers that counts the records (and swallows them, so a flood of drops
does not flood the log). The counts are per *process*: a node runs one host per process.

Peer resets. When a peer closes its TCP socket while bytes we sent are still unread in its
receive buffer, its kernel answers with RST (that is TCP, not a bug of either side: a peer
that stops, crashes or is killed while we gossip to it always does this). Our next write on
that connection fails with EPIPE, which py-libp2p's yamux reader reports as
``Error in handle_incoming …: ConnectionClosedError: TCP connection reset by remote peer``
at ERROR level, although it then treats the connection as closed like any other
disconnect. A peer leaving is routine for a cluster (our own disconnect handling logs it), so
those records are re-classified to INFO and counted as ``peer_connection_reset``; any other
yamux error keeps its level.

Stream opens on a connection that just went away. When a stream is being opened (py-libp2p's
identify on a connection, a pubsub stream, one of our requests) at the moment the peer
closes or resets the connection, the multistream negotiation's first write or read fails;
``BasicHost.new_stream`` logs ``Failed to open stream to peer … fail to write to (read from)
multiselect communicator`` at ERROR, then raises ``StreamFailure``, which every caller
handles (identify and pubsub drop the peer or retry while connected; our requests report a
failure or retry, ``exo_p2p.net.reqresp``). Seen in 1 of ~20 clean shutdowns with traffic in
flight (the peer's identify stream on a connection it was resetting). Those
records are re-classified to INFO and counted as ``peer_stream_open_failed``; a stream open
that fails for any other reason (no common protocol, a negotiation timeout) keeps ERROR.
"""

from __future__ import annotations

import logging
import threading

OUTBOUND_LOGGER = "libp2p.pubsub.rpc_queue"
PUBSUB_LOGGER = "libp2p.pubsub.pubsub"

YAMUX_LOGGER = "libp2p.stream_muxer.yamux.yamux"
HOST_LOGGER = "libp2p.host.basic_host"

_counts: dict[str, int] = {
    "lib_outbound_rpc_dropped": 0,
    "lib_subscription_dropped": 0,
    "peer_connection_reset": 0,
    "peer_stream_open_failed": 0,
}
_lock = threading.Lock()
_installed = False


class _DropFilter(logging.Filter):
    def __init__(self, needle: str, key: str) -> None:
        super().__init__()
        self.needle = needle
        self.key = key

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(self.needle):
            with _lock:
                _counts[self.key] += 1
            return False
        return True


class _ReclassifyFilter(logging.Filter):
    """Re-classifies a py-libp2p ERROR record that starts with ``prefix`` and contains one of
    ``needles`` to INFO and counts it under ``key`` (module docstring: a peer that reset its
    connection, a stream opened on a connection that went away); every other record passes
    unchanged."""

    def __init__(self, prefix: str, needles: tuple[str, ...], key: str) -> None:
        super().__init__()
        self.prefix, self.needles, self.key = prefix, needles, key

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        if (record.levelno >= logging.ERROR and isinstance(msg, str) and msg.startswith(self.prefix)
                and any(n in msg for n in self.needles)):
            with _lock:
                _counts[self.key] += 1
            record.levelno = logging.INFO
            record.levelname = logging.getLevelName(logging.INFO)
        return True


def install() -> None:
    """Attach the counting filters once per process (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    outbound = logging.getLogger(OUTBOUND_LOGGER)
    outbound.addFilter(_DropFilter("Dropping outbound RPC", "lib_outbound_rpc_dropped"))
    if outbound.getEffectiveLevel() > logging.DEBUG:
        outbound.setLevel(logging.DEBUG)  # the drop record is debug-level; the filter eats it
    logging.getLogger(PUBSUB_LOGGER).addFilter(
        _DropFilter("fail to deliver message to subscription", "lib_subscription_dropped")
    )
    logging.getLogger(YAMUX_LOGGER).addFilter(_ReclassifyFilter(
        "Error in handle_incoming", ("ConnectionClosedError: TCP connection reset by remote peer",), "peer_connection_reset"))
    logging.getLogger(HOST_LOGGER).addFilter(_ReclassifyFilter(
        "Failed to open stream to peer",
        ("fail to write to multiselect communicator", "fail to read from multiselect communicator"), "peer_stream_open_failed"))


def snapshot() -> dict[str, int]:
    """Current process-wide drop counts by kind."""
    with _lock:
        return dict(_counts)
