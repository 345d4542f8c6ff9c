"""structlog configuration for the node (``--log-format json|console``), to stderr."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(fmt: str = "console", level: str = "info") -> None:
    """Route structlog and stdlib logging to stderr as JSON lines or console text."""
    lvl = getattr(logging, level.upper(), logging.INFO)
    renderer = structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=max(lvl, logging.WARNING), stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    # py-libp2p logs an ERROR for every failed re-dial of a peer that is down; our re-dialler
    # retries with backoff and reports peers itself, so keep those out of the node's log.
    for noisy in ("libp2p.transport.tcp.tcp", "libp2p.network.swarm", "libp2p.discovery.mdns"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    # libp2p's own warnings (failed handshakes of peers going away, failed health pings) are
    # what our cluster layer turns into peer events; its errors still show.
    logging.getLogger("libp2p").setLevel(max(lvl, logging.ERROR))
