"""Counts of messages py-libp2p drops silently (libp2p-notes §3).

py-libp2p 0.8.1 only *logs* when it drops a pubsub message: a full outbound per-peer queue
(32 RPCs) or an oversized RPC ("Dropping outbound RPC", debug level), or a full subscription
queue ("fail to deliver message to subscription", warning). ``install()`` attaches a logging
filter to those two loggers that counts the records (and swallows them, so a flood of drops
does not flood the log). The counts are per *process*: a node runs one host per process.
"""

from __future__ import annotations

import logging
import threading

OUTBOUND_LOGGER = "libp2p.pubsub.rpc_queue"
PUBSUB_LOGGER = "libp2p.pubsub.pubsub"

_counts: dict[str, int] = {"lib_outbound_rpc_dropped": 0, "lib_subscription_dropped": 0}
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


def snapshot() -> dict[str, int]:
    """Current process-wide drop counts by kind."""
    with _lock:
        return dict(_counts)
