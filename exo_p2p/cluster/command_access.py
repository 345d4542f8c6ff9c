"""Who may send commands to the master (pure; docs/architecture.md#rules "Commands"; docs/cluster.md).

The master answers a command on ``/exo-p2p/command/1`` only for a member, sending in its own
name (the envelope's ``origin`` is the peer that opened the stream: libp2p authenticates peer
ids with Noise). A member is a peer whose node is in the cluster's State (its profile was
indexed) or whose live heartbeat follows this master (a node that just joined, or was timed
out and is coming back, before its profile is indexed again). Anyone else gets a 403
``not_member`` answer and nothing is sequenced; the command client retries that answer
briefly (its own profile may be on its way).

In an open cluster this keeps out hosts that speak the protocol without joining; it is not
authentication (a host may join first): a closed cluster (``--cluster-secret``) is.
"""

from __future__ import annotations

from collections.abc import Container

NOT_MEMBER = "not_member"


def command_refusal(peer: str, origin: str, members: Container[str], followers: Container[str] = ()) -> str | None:
    """Why a command from ``peer`` with envelope origin ``origin`` is refused, or None when
    it may be decided. ``members``: the node ids in State; ``followers``: the peers whose
    live heartbeat names this master."""
    if origin != peer:
        return f"a command must be sent by its origin node (stream from {peer}, origin {origin})"
    if peer not in members and peer not in followers:
        return f"node {peer} is not a member of this cluster (not in its State): commands refused"
    return None
