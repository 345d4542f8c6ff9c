"""The last steps of a host's shutdown, run under a shielded scope before ``host.run`` exits
(docs/architecture.md#networking-notes, note 1): pin the host's addresses, stop the swarm's
auto-connector, close its listeners.
"""

from __future__ import annotations

import structlog
from libp2p.abc import IHost

log = structlog.get_logger(__name__)


async def quiesce(host: IHost, swarm) -> None:  # type: ignore[no-untyped-def]
    """Stop what dials and pin the host's addresses before the listeners close.

    Beyond networking note 1 (docs/architecture.md): GossipSub reads the host's addresses for every message it forwards
    (``env_to_send_in_RPC`` → ``get_addrs`` → ``getsockname`` of each listener socket). A
    message forwarded while a listener is closing hits a closed socket (EBADF), which fails the
    Pubsub service and the whole ``trio.run`` (seen in 1 of ~20 shutdowns under traffic). The
    Pubsub services must keep running until the swarm is gone (stopping them first brings back
    "Nursery is closed to new arrivals"), so the addresses are frozen instead: the instance
    attributes shadow the methods for the rest of this host's life.
    """
    transport_addrs = list(host.get_transport_addrs())
    addrs = list(host.get_addrs())
    host.get_transport_addrs = lambda: list(transport_addrs)  # type: ignore[method-assign]
    host.get_addrs = lambda: list(addrs)  # type: ignore[method-assign]
    await swarm.auto_connector.stop()


async def close_listeners(swarm) -> None:  # type: ignore[no-untyped-def]
    """Close every listener of ``swarm``; a listener that fails to close is logged (debug)
    and the others are closed still."""
    listeners = list(swarm.listeners.values())
    for listener in listeners:
        try:
            await listener.close()
        except Exception as exc:
            log.debug("listener close failed", error=repr(exc))
