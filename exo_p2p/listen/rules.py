"""Every listener a node opens, with its admission rule (docs/security.md#listeners).

Each TCP port a node process listens on must bound, in numbers a reviewer can read here:
how many connections it handles at once (``total``), how many of them one source address
(or, once proven, one peer id) may hold (``per_source``), and how long a connection may take
to say who it is or what it wants before it is closed (``deadline_s``).
``tests/test_listener_rules.py`` finds every place in the code that opens a listener and
fails when one is not in :data:`LISTENERS`, and checks each rule's numbers are sane; the
probe and flood tests check the rules hold on real nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from exo_p2p import limits
from exo_p2p.listen.admission import per_source_cap
from exo_p2p.api import server as api_server
from exo_p2p.links import probe_server
from exo_p2p.models.transfer import bulk
from exo_p2p.net import inbound
from exo_p2p.net.config import NetConfig


@dataclass(frozen=True)
class ListenerRule:
    """One listener: ``name``; ``module`` that opens it; ``total`` connections at once;
    ``per_source`` of them from one source address; ``deadline_s``: seconds a connection has
    for its handshake (token, request head, Noise); ``how``: where the rule is enforced."""

    name: str
    module: str
    total: int
    per_source: int
    deadline_s: float
    how: str


LISTENERS: tuple[ListenerRule, ...] = (
    ListenerRule("HTTP API", "exo_p2p.api.server", limits.API_MAX_CONNECTIONS,
                 per_source_cap(limits.API_MAX_CONNECTIONS), api_server.KEEP_ALIVE_TIMEOUT,
                 "exo_p2p.listen.accept.serve_bounded (cap: exo_p2p.limits.api_connection_cap)"),
    ListenerRule("libp2p", "exo_p2p.net.host_build", limits.LIBP2P_MAX_INBOUND, inbound.LIBP2P_PER_SOURCE,
                 next(f.default for f in fields(NetConfig) if f.name == "dial_timeout"),  # type: ignore[misc]
                 "py-libp2p's inbound limiter and upgrade timeout; exo_p2p.net.inbound"),
    ListenerRule("model transfer (bulk)", "exo_p2p.models.transfer.bulk", bulk.MAX_UNREDEEMED + bulk.MAX_CONNECTIONS,
                 bulk.PER_SOURCE_UNREDEEMED, bulk.TICKET_WAIT,
                 "exo_p2p.listen.admission.WaitingRoom, then a ticket's serving slot"),
    ListenerRule("link probe", "exo_p2p.links.probe_server", probe_server.MAX_WAITING + probe_server.MAX_CONNECTIONS,
                 probe_server.PER_SOURCE_WAITING, probe_server.TOKEN_WAIT,
                 "exo_p2p.listen.admission.WaitingRoom, then a ticket's serving slot (per peer id)"),
)
"""The listeners of a node process. MLX's ring between the ranks of an instance is opened by
MLX (C++) inside a runner, not by this code, and is not listed."""
