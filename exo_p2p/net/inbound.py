"""Inbound libp2p connections per source address (docs/security.md).

py-libp2p bounds inbound connections in all (``LIBP2P_MAX_INBOUND``, handshaking or
established, ``exo_p2p.net.host_build.connection_config``) and the time of a handshake
(``inbound_upgrade_timeout``), but one host could still hold every inbound slot. So
:func:`limit_per_source` wraps the swarm's inbound handler: a connection arriving while its
source address already holds ``per_source`` inbound connections (default
``exo_p2p.listen.admission.per_source_cap(LIBP2P_MAX_INBOUND)``) is closed on arrival, before the
library takes a slot or starts a handshake.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from exo_p2p.listen.admission import per_source_cap
from exo_p2p.limits import LIBP2P_MAX_INBOUND

log = structlog.get_logger(__name__)

LIBP2P_PER_SOURCE = per_source_cap(LIBP2P_MAX_INBOUND)
"""Inbound libp2p connections one source address may hold at once."""


def source_of(conn: object) -> str:
    """The remote IP of a raw inbound connection (``get_remote_address()``), "" when unknown."""
    try:
        remote = conn.get_remote_address()  # type: ignore[attr-defined]
    except Exception:  # a connection torn down already has none
        return ""
    return str(remote[0]) if remote else ""


def per_source_handler(inner: Callable[..., Awaitable[Any]], per_source: int,
                       refused: Counter[str]) -> Callable[..., Awaitable[Any]]:
    """``inner`` (the swarm's ``_handle_inbound_connection(conn, maddr)``) run only while the
    connection's source holds fewer than ``per_source`` connections in it; others are closed
    at once and counted in ``refused`` by source."""
    holding: Counter[str] = Counter()

    async def handle(conn: Any, maddr: Any) -> None:
        source = source_of(conn)
        if holding[source] >= per_source:
            refused[source] += 1
            if refused[source] % 100 == 1:
                log.warning("libp2p connection refused: its source holds its share", source=source,
                            per_source=per_source, refused_so_far=refused[source])
            try:
                await conn.close()
            except Exception:  # closing a connection that broke already
                pass
            return
        holding[source] += 1
        try:
            await inner(conn, maddr)
        finally:
            holding[source] -= 1
            if not holding[source]:
                del holding[source]

    return handle


def limit_per_source(swarm: object, per_source: int = LIBP2P_PER_SOURCE) -> Counter[str]:
    """Wrap ``swarm``'s inbound handler (:func:`per_source_handler`); returns the counter of
    refused connections by source. The swarm's listeners look the handler up per connection,
    so this works before or after ``listen``."""
    refused: Counter[str] = Counter()
    inner = swarm._handle_inbound_connection  # type: ignore[attr-defined]
    swarm._handle_inbound_connection = per_source_handler(inner, per_source, refused)  # type: ignore[attr-defined]
    return refused
