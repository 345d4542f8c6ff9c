"""The rules that keep a node's descriptors bounded, without sockets or processes: the
open-file limit never lowered (``exo_p2p.limits``), the accept loop's cap and its patience
with transient OS errors (``exo_p2p.listen.accept``), the API's body deadline
(``exo_p2p.api.slow_clients``). Real nodes under a flood: ``tests/test_flood.py``."""

from __future__ import annotations

import errno
import resource

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from exo_p2p import limits
from exo_p2p.api.slow_clients import BodyDeadline
from exo_p2p.listen.accept import BACKOFF_MAX, backoff_delay, is_transient, serve_bounded
from tests.support.serve_script import _FakeListener, serve_script

INF = resource.RLIM_INFINITY
limit_values = st.one_of(st.just(INF), st.integers(0, 1 << 20))


def _rank(v: int) -> float:
    return float("inf") if v == INF else v


@st.composite
def limit_pairs(draw) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    a, b = draw(limit_values), draw(limit_values)
    return (a, b) if _rank(a) <= _rank(b) else (b, a)


@given(limit_pairs(), limit_pairs())
def test_kept_limits_are_never_lower_than_current_nor_requested(requested, current):
    soft, hard = limits.kept_nofile(requested, current)
    assert _rank(hard) >= max(_rank(requested[1]), _rank(current[1]))
    assert _rank(soft) >= _rank(current[0])
    assert _rank(soft) <= _rank(hard)


def test_mlx_lm_request_changes_nothing_on_a_higher_limit():
    assert limits.kept_nofile((2048, 4096), (20000, 20000)) == (20000, 20000)
    assert limits.kept_nofile((2048, 4096), (1024, 4096)) == (2048, 4096)  # a raise passes
    assert limits.kept_nofile((2048, 4096), (1024, INF)) == (2048, INF)


def test_guarded_setrlimit_never_lowers_nofile_and_passes_other_resources():
    calls: list[tuple[int, tuple[int, int]]] = []
    current = {resource.RLIMIT_NOFILE: (20000, 20000)}
    setrlimit = limits.guarded(lambda which, lim: calls.append((which, lim)), lambda which: current[which])
    setrlimit(resource.RLIMIT_NOFILE, (2048, 4096))  # what mlx-lm asks at import
    assert calls == []
    current[resource.RLIMIT_NOFILE] = (1024, 20000)
    setrlimit(resource.RLIMIT_NOFILE, (2048, 4096))
    assert calls == [(resource.RLIMIT_NOFILE, (2048, 20000))]
    setrlimit(resource.RLIMIT_CORE, (0, 0))
    assert calls[-1] == (resource.RLIMIT_CORE, (0, 0))


def test_the_guard_is_installed_in_this_process_and_mlx_lm_keeps_the_limit():
    """conftest installs the guard, as the node and the runner do first thing: importing
    mlx-lm here leaves this process's limits as they were."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    import mlx_lm  # noqa: F401

    assert resource.getrlimit(resource.RLIMIT_NOFILE) == before


def test_a_lowered_soft_limit_is_restored_by_the_check():
    """What a library that bypasses the guard does to the soft limit, ``check_nofile`` undoes
    (the hard one could not be)."""
    kept = limits.keep_nofile("test")
    if kept[0] < 512:
        pytest.skip("this process's limit is too low to lower it")
    limits._state["original"](resource.RLIMIT_NOFILE, (256, kept[1]))  # type: ignore[operator]
    try:
        assert limits.check_nofile("test") == kept
    finally:
        limits._state["original"](resource.RLIMIT_NOFILE, kept)  # type: ignore[operator]


@pytest.mark.parametrize("current,wanted", [
    ((1024, 20000), 20000), ((20000, 20000), 20000), ((1024, INF), limits.NOFILE_CEILING),
    ((100000, INF), 100000), ((256, 256), 256),
])
def test_wanted_soft_is_the_hard_limit(current, wanted):
    assert limits.wanted_soft(current) == wanted


@given(st.integers(0, 1 << 20))
def test_api_cap_fits_the_budget(nofile):
    cap = limits.api_connection_cap(nofile)
    assert limits.API_MIN_CONNECTIONS <= cap <= limits.API_MAX_CONNECTIONS
    reserved = limits.FD_RESERVE + limits.LIBP2P_MAX_CONNECTIONS + limits.BULK_MAX_CONNECTIONS + limits.PROBE_MAX_CONNECTIONS
    assert cap == limits.API_MIN_CONNECTIONS or cap + reserved <= nofile


def test_the_bulk_budget_is_what_the_bulk_listener_can_hold():
    from exo_p2p.models.transfer import bulk

    assert limits.BULK_MAX_CONNECTIONS == bulk.MAX_UNREDEEMED + bulk.MAX_CONNECTIONS


def test_the_probe_budget_is_what_the_probe_listener_can_hold():
    from exo_p2p.links import probe_server

    assert limits.PROBE_MAX_CONNECTIONS == probe_server.MAX_WAITING + probe_server.MAX_CONNECTIONS


def test_api_cap_figures():
    assert limits.api_connection_cap(20000) == 4096
    assert limits.api_connection_cap(4096) == 4096 - 1024 - 300 - 80 - 80
    assert limits.api_connection_cap(1024) == limits.API_MIN_CONNECTIONS
    assert limits.api_connection_cap(INF) == 4096


# --- the accept loop ------------------------------------------------------------------------------
def test_transient_errors():
    for code in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED):
        assert is_transient(OSError(code, "x"))
    assert not is_transient(OSError(errno.EBADF, "x"))
    assert not is_transient(ValueError())


@given(st.integers(0, 200))
def test_backoff_grows_and_is_capped(n):
    assert 0 <= backoff_delay(n) <= BACKOFF_MAX
    assert backoff_delay(n) <= backoff_delay(n + 1)
    assert backoff_delay(0) == 0


class _FakeSocket:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class _FakeStream:
    def __init__(self) -> None:
        self.socket = _FakeSocket()

    async def aclose(self) -> None:
        self.socket.close()


def test_serve_bounded_caps_connections_and_rides_out_emfile():
    """Three connections under a cap of two: the third is closed at once; EMFILE and
    ECONNABORTED between them pause the loop instead of ending it."""
    streams = [_FakeStream() for _ in range(3)]
    script = [streams[0], OSError(errno.EMFILE, "Too many open files"), streams[1],
              OSError(errno.ECONNABORTED, "aborted"), OSError(errno.EMFILE, "again"), streams[2]]
    served, refused = serve_script(script, 30, max_connections=2)
    assert served == streams[:2] and refused == 1 and streams[2].socket.closed


def test_serve_bounded_raises_other_errors():
    async def main() -> None:
        await serve_bounded(_FakeListener([OSError(errno.EBADF, "bad")]), None, max_connections=1, name="t")  # type: ignore[arg-type]

    with pytest.raises(BaseExceptionGroup) as raised:  # noqa: F821 - Python 3.11 builtin
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert raised.value.split(OSError)[1] is None


# --- the body deadline ----------------------------------------------------------------------------
def _body_run(messages_every: float, n_parts: int) -> list[dict]:
    """Run ``BodyDeadline(20 s)`` around an app that reads the body and answers 200, with a
    client sending ``n_parts`` body parts ``messages_every`` s apart; returns what was sent."""
    sent: list[dict] = []

    async def receive():  # type: ignore[no-untyped-def]
        receive.count += 1  # type: ignore[attr-defined]
        await trio.sleep(messages_every)
        return {"type": "http.request", "body": b"x", "more_body": receive.count < n_parts}  # type: ignore[attr-defined]

    receive.count = 0  # type: ignore[attr-defined]

    async def send(message) -> None:  # type: ignore[no-untyped-def]
        sent.append(message)

    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        from starlette.requests import Request

        await Request(scope, receive).body()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def main() -> None:
        await BodyDeadline(app, 20.0)({"type": "http", "method": "POST", "path": "/", "headers": []}, receive, send)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return sent


def test_a_slow_body_gets_408_at_its_deadline():
    sent = _body_run(messages_every=1.0, n_parts=1000)  # a slowloris: a byte a second
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"]


def test_a_body_within_the_deadline_is_served():
    assert _body_run(messages_every=1.0, n_parts=15)[0]["status"] == 200


def test_a_handler_that_raises_ends_its_connection_only():
    streams = [_FakeStream(), _FakeStream()]
    served: list[_FakeStream] = []

    async def handler(stream) -> None:  # type: ignore[no-untyped-def]
        served.append(stream)
        raise RuntimeError("a bug in one connection")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: serve_bounded(_FakeListener(list(streams)), handler, max_connections=1, name="t"))
            await trio.sleep(5)
            assert served == streams and all(s.socket.closed for s in streams)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_bulk_connection_without_a_token_is_closed_after_its_timeout():
    """A connection to the model-transfer port that sends nothing ends quietly after
    ``TICKET_WAIT`` (it once raised and took the node down)."""
    from exo_p2p.models.transfer.bulk import TICKET_WAIT, BulkServer

    async def main() -> None:
        server_side, client_side = trio.testing.memory_stream_pair()
        started = trio.current_time()
        await BulkServer(lambda digest: None)._handle(server_side)  # type: ignore[arg-type]
        assert trio.current_time() - started == pytest.approx(TICKET_WAIT)
        assert await client_side.receive_some(1) == b""  # closed by the server

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_response_the_client_does_not_read_closes_its_connection():
    """hypercorn's writes have no bound; ``BoundedTCPServer``'s wait ``SEND_TIMEOUT`` s for
    the client to take them, then close the connection."""
    from hypercorn.config import Config
    from hypercorn.events import Closed, RawData

    from exo_p2p.api.server import SEND_TIMEOUT, BoundedTCPServer

    handled: list[object] = []

    class Protocol:
        async def handle(self, event: object) -> None:
            handled.append(event)

    async def main() -> None:
        server_side, _never_read = trio.testing.lockstep_stream_pair()
        server = BoundedTCPServer(None, Config(), None, {}, server_side)  # type: ignore[arg-type]
        server.protocol = Protocol()  # type: ignore[assignment]
        returned_after: list[float] = []

        async def write() -> None:
            started = trio.current_time()
            await server.protocol_send(RawData(b"x" * 1024))
            returned_after.append(trio.current_time() - started)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write)
            await trio.sleep(2 * SEND_TIMEOUT)
            if not returned_after:  # hypercorn's own TCPServer waits forever: break its write
                await trio.aclose_forcefully(server_side)
        assert returned_after and returned_after[0] == pytest.approx(SEND_TIMEOUT)
        assert handled and isinstance(handled[-1], Closed)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
