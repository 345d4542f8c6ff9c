"""The pure rules of exo_p2p.net's host pieces: a dial to ourselves, a publish's queue
room, what the host listens on and its inbound connection bound (no host, no socket)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from exo_p2p.limits import LIBP2P_MAX_CONNECTIONS, LIBP2P_MAX_INBOUND
from exo_p2p.net.dialer import dials_self, without_peer_id
from exo_p2p.net.gossip import queues_have_room
from exo_p2p.net.host_build import connection_config, listen_multiaddrs

OWN = ["/ip4/10.0.0.1/tcp/4001", "/ip4/127.0.0.1/tcp/4001/p2p/QmSelf"]


def test_a_dial_of_our_id_at_our_own_addresses_is_a_dial_to_ourselves() -> None:
    assert without_peer_id("/ip4/1.2.3.4/tcp/5/p2p/QmX") == "/ip4/1.2.3.4/tcp/5"
    assert dials_self(OWN, ["/ip4/127.0.0.1/tcp/4001/p2p/QmSelf"])
    assert dials_self(OWN, ["/ip4/10.0.0.1/tcp/4001", "/ip4/127.0.0.1/tcp/4001"])
    assert dials_self(OWN, [])  # no address to reach anyone else at


def test_our_id_at_a_foreign_address_is_another_process_and_is_dialled() -> None:
    assert not dials_self(OWN, ["/ip4/10.0.0.2/tcp/4001/p2p/QmSelf"])
    assert not dials_self(OWN, ["/ip4/10.0.0.1/tcp/4001", "/ip4/10.0.0.1/tcp/4002"])


@given(st.lists(st.integers(0, 40)), st.integers(1, 32))
def test_a_publish_waits_while_any_peer_queue_is_at_high_water(lengths: list[int], high: int) -> None:
    assert queues_have_room(lengths, high) == (not lengths or max(lengths) < high)


def test_a_concrete_listen_host_is_listened_on_as_given() -> None:
    assert [str(a) for a in listen_multiaddrs("127.0.0.1", 4001)] == ["/ip4/127.0.0.1/tcp/4001"]


def test_inbound_connections_are_bounded_and_handshakes_timed() -> None:
    from exo_p2p.net import NetConfig

    cfg = NetConfig(identity=None)  # type: ignore[arg-type]
    conn = connection_config(cfg)
    assert conn.max_connections == LIBP2P_MAX_CONNECTIONS
    assert conn.max_connections - conn.min_connections == LIBP2P_MAX_INBOUND
    assert conn.inbound_upgrade_timeout == conn.outbound_upgrade_timeout == cfg.dial_timeout
