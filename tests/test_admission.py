"""Per-source admission of every listener (``exo_p2p.listen.admission``, ``exo_p2p.listen.rules``),
without sockets or processes: who a crowd of unproven connections evicts, the API's and
libp2p's per-source caps, and that every place in the code opening a listener has a rule.
Real sockets and nodes: ``tests/test_probe_guard.py``."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from exo_p2p.listen.admission import WaitingRoom, per_source_cap, victim
from exo_p2p.listen.rules import LISTENERS
from exo_p2p.net.inbound import per_source_handler
from tests.support.serve_script import serve_script

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parent.parent

sources = st.sampled_from(["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"])


@given(st.lists(sources, max_size=200), st.integers(1, 16), st.integers(0, 16))
def test_the_room_never_exceeds_its_caps_and_a_source_at_its_cap_evicts_only_itself(arrivals, cap, extra) -> None:
    """Whatever order connections arrive in: at most ``capacity`` wait, at most ``per_source``
    of one source, and a source at its cap (or the largest one when full) pays for a newcomer."""
    per_source, capacity = cap, cap + extra
    room: list[tuple[int, str]] = []
    for i, src in enumerate(arrivals):
        before = Counter(s for _, s in room)
        out = victim(room, src, capacity, per_source)
        if out is not None:
            gone = next(s for k, s in room if k == out)
            assert gone == src or (len(room) >= capacity and before[gone] == max(before.values()))
            room = [(k, s) for k, s in room if k != out]
        room.append((i, src))
        counts = Counter(s for _, s in room)
        assert len(room) <= capacity and max(counts.values()) <= per_source


def test_a_crowd_from_one_address_cannot_evict_another_address() -> None:
    room = [(i, "10.0.0.66") for i in range(16)] + [(99, "10.0.0.2")]
    for i in range(100):
        out = victim(room, "10.0.0.66", 64, 16)
        assert out is not None and out != 99
        room = [(k, s) for k, s in room if k != out] + [(100 + i, "10.0.0.66")]
    assert (99, "10.0.0.2") in room


def test_per_source_caps_keep_a_share_for_other_sources() -> None:
    assert per_source_cap(4096) == 3584 and per_source_cap(256) == 224 and per_source_cap(1) == 1
    assert all(1 <= per_source_cap(n) <= n for n in range(1, 5000))


def test_the_waiting_room_evicts_the_oldest_of_the_crowding_source_and_times_out_the_rest() -> None:
    room = WaitingRoom(capacity=4, per_source=2, wait=2.0)
    places = []

    async def wait(source: str) -> None:
        with room.enter(source) as place:
            places.append(place)
            with place.scope:
                await trio.sleep_forever()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for source in ["a", "b", "a", "a", "a"]:
                nursery.start_soon(wait, source)
                await trio.sleep(0.1)
            assert room.by_source() == {"a": 2, "b": 1} and room.crowded()
            assert [p.evicted for p in places] == [True, False, True, False, False]
        assert len(room) == 0 and room.counts == {"evicted": 2, "timed_out": 3}

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    with pytest.raises(ValueError):
        WaitingRoom(capacity=2, per_source=3, wait=1.0)


class _Socket:
    def __init__(self, ip: str) -> None:
        self.ip, self.closed = ip, False

    def getpeername(self) -> tuple[str, int]:
        return (self.ip, 40000)

    def close(self) -> None:
        self.closed = True


class _Stream:
    def __init__(self, ip: str) -> None:
        self.socket = _Socket(ip)

    async def aclose(self) -> None:
        self.socket.close()


def test_serve_bounded_closes_a_connection_beyond_its_sources_share() -> None:
    """A cap of 8, 3 per source: the fourth connection of one address is closed on arrival,
    another address is still served."""
    streams = [_Stream("10.0.0.66") for _ in range(4)] + [_Stream("10.0.0.2")]
    served, refused = serve_script(list(streams), 5, max_connections=8, per_source=3)
    assert served == streams[:3] + streams[4:] and refused == 1 and streams[3].socket.closed


class _Conn:
    def __init__(self, ip: str) -> None:
        self.ip, self.closed = ip, False

    def get_remote_address(self) -> tuple[str, int]:
        return (self.ip, 4001)

    async def close(self) -> None:
        self.closed = True


def test_libp2p_inbound_connections_beyond_a_sources_share_are_closed_before_the_handshake() -> None:
    handled: list[_Conn] = []

    async def inner(conn, maddr) -> None:  # type: ignore[no-untyped-def]
        handled.append(conn)
        await trio.sleep(10)

    refused: Counter[str] = Counter()
    handle = per_source_handler(inner, 2, refused)
    conns = [_Conn("10.0.0.66") for _ in range(3)] + [_Conn("10.0.0.2")]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for conn in conns:
                nursery.start_soon(handle, conn, None)
                await trio.sleep(0.1)
        # all ended: the source's slots are free again
        await handle(_Conn("10.0.0.66"), None)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert handled[:3] == [conns[0], conns[1], conns[3]] and conns[2].closed and len(handled) == 4
    assert refused == {"10.0.0.66": 1}


OPENS_A_LISTENER = {"listen", "open_tcp_listeners", "serve_listeners", "serve_tcp", "SocketListener",
                    "new_host", "create_server", "start_server", "serve_forever"}
"""Calls that open or serve a listening socket (``new_host``: py-libp2p's host, which listens)."""


def _listener_calls(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in OPENS_A_LISTENER:
                names.append(f"{name}@{node.lineno}")
    return names


def test_every_listener_in_the_code_has_an_admission_rule() -> None:
    """Every module of the node, its workers and master that opens a listener is one of
    ``LISTENERS`` (or only calls into one of them); a new listener without a rule fails here."""
    ruled = {rule.module for rule in LISTENERS}
    found: dict[str, list[str]] = {}
    for package in ("exo_p2p", "worker", "master"):
        for path in sorted((REPO / package).rglob("*.py")):
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            calls = _listener_calls(path)
            if calls:
                found[module] = calls
    unruled = {m: c for m, c in found.items() if m not in ruled}
    assert not unruled, f"listeners without an admission rule in exo_p2p.listen.rules: {unruled}"
    assert ruled <= set(found), f"rules whose module opens no listener any more: {ruled - set(found)}"


def test_every_rule_bounds_sources_and_handshakes() -> None:
    for rule in LISTENERS:
        assert 1 <= rule.per_source < rule.total, rule
        assert 0 < rule.deadline_s <= 10, rule


def test_a_libp2p_host_is_built_with_the_per_source_cap() -> None:
    """The node's libp2p host (``new_libp2p_host``) runs every inbound connection through
    ``per_source_handler``: an address holding its share is refused before the library's."""
    from exo_p2p.net import NetConfig
    from exo_p2p.net.host_build import listen_multiaddrs, new_libp2p_host
    from exo_p2p.net.identity import identity_from_seed

    host = new_libp2p_host(NetConfig(identity=identity_from_seed(b"\1" * 32)), listen_multiaddrs("127.0.0.1", 0))
    handler = host.get_network()._handle_inbound_connection  # type: ignore[attr-defined]
    assert handler.__qualname__ == "per_source_handler.<locals>.handle"
