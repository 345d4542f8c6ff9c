"""A request whose new stream dies at once is tried again on a fresh stream.

Under scripts/chaos.py direct streams to the master failed with py-libp2p's "MultiselectClient
handshake read failed": the remote reset the new stream before answering the multistream
handshake (a connection being torn down, a stream its swarm refused). Each such failure cost
a direct heartbeat or a local-event send a whole retry period (a restarted node's profile was
indexed 9-11 s late). Nothing of the request was sent yet, so ``exo_p2p.net.reqresp`` opens
the stream again, a bounded number of times within the request's timeout.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from libp2p.abc import INetConn, INetStream, INetwork, INotifee
from libp2p.host.exceptions import StreamFailure
from libp2p.network.swarm import SwarmDialAllFailedError
from libp2p.protocol_muxer.exceptions import MultiselectClientError
from multiaddr import Multiaddr

from exo_p2p import defaults
from exo_p2p.net import open_host
from exo_p2p.net.reqresp import stream_died_at_once
from tests.support.net.net_run import config, run, wait_connected


class ResetNextInbound(INotifee):
    """Resets the next ``n`` streams the remote opens to this host, before they negotiate."""

    def __init__(self) -> None:
        self.left = 0
        self.done = 0

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        if self.left > 0:
            self.left -= 1
            self.done += 1
            await stream.reset()

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        pass

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        pass

    async def listen(self, network: INetwork, multiaddr: Multiaddr) -> None:
        pass

    async def listen_close(self, network: INetwork, multiaddr: Multiaddr) -> None:
        pass


@pytest.mark.integration
@pytest.mark.parametrize("resets", [1, defaults.STREAM_OPEN_ATTEMPTS - 1])
def test_a_request_whose_stream_is_reset_before_negotiation_is_sent_on_a_new_stream(tmp_path: Path, resets: int) -> None:
    async def body() -> None:
        async with open_host(config(tmp_path, "server")) as server, open_host(config(tmp_path, "client")) as client:
            async def echo(peer: str, data: bytes) -> bytes:
                return data

            server.set_request_handler("/echo/1", echo)
            resetter = ResetNextInbound()
            server._host.get_network().register_notifee(resetter)
            await client.dial(server.listen_addrs()[0], timeout=10)
            await wait_connected(client, server.node_id)
            await trio.sleep(1.0)  # identify and gossip streams opened; pings every 2 s
            resetter.left = resets
            reply = await client.request(server.node_id, "/echo/1", b"hello", timeout=5)
            assert reply == b"hello"
            assert resetter.done >= 1

    run(body)


def test_which_failures_are_tried_again() -> None:
    died = StreamFailure("failed to open a stream to peer x")
    died.__cause__ = MultiselectClientError("handshake read failed: fail to read from multiselect communicator")
    assert stream_died_at_once(died)
    assert stream_died_at_once(MultiselectClientError("handshake write failed: x"))
    unsupported = StreamFailure("failed to open a stream to peer x")
    unsupported.__cause__ = MultiselectClientError("Protocols not supported: ['/x/1']")
    assert not stream_died_at_once(unsupported)
    assert not stream_died_at_once(MultiselectClientError("response timed out after 5s, protocols tried: ['/x/1']"))
    assert not stream_died_at_once(SwarmDialAllFailedError("unable to connect to x", peer_id=None, num_addrs_tried=1))
    assert not stream_died_at_once(ValueError("bad peer id"))


@pytest.mark.integration
def test_a_dial_to_a_dead_address_fails_fast(tmp_path: Path) -> None:
    """A peer that restarted listens on a new port; a dial to its old address is refused at
    once. py-libp2p's swarm retried it 3 times 0.1-0.4 s apart (>= 0.63 s), holding the
    per-peer dial lock, so the dial to the peer's current address waited: the restarted
    node reached its master ~2 s late under load. Now one retry after ``DIAL_RETRY_DELAY``."""
    import socket
    import time

    from exo_p2p.net import DialError

    async def body() -> None:
        async with open_host(config(tmp_path, "a")) as a, open_host(config(tmp_path, "b")) as b:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                dead = s.getsockname()[1]  # closed again: nobody listens there
            addr = f"/ip4/127.0.0.1/tcp/{dead}/p2p/{b.node_id}"
            took = []
            for _ in range(3):
                t0 = time.monotonic()
                with pytest.raises(DialError):
                    await a.dial(addr, timeout=5)
                took.append(time.monotonic() - t0)
            assert min(took) < 0.45, took
            assert a._host.get_network().retry_config.max_retries == defaults.DIAL_RETRIES

    run(body)
