"""Request/response over one libp2p stream per request (docs/architecture.md#networking-notes, note 12).

The requester opens a stream on the protocol, writes one frame (the request) and reads one frame
(status byte + reply, see ``framing``). The server reads the request under a timeout (a peer
that opens a stream and never sends is dropped and counted), runs the handler under its own
timeout, writes the reply and closes. Handler errors travel back as ``STATUS_ERROR`` with a
description, so a caller gets a RemoteError instead of a hang.

Opening the stream is tried again (``STREAM_OPEN_ATTEMPTS``, ``STREAM_RETRY_PAUSE`` in
``exo_p2p.defaults``, all within the request's timeout) when its negotiation died at once:
py-libp2p reports "handshake read failed" when the remote reset the new stream before
answering the multistream handshake, or the connection closed under it (a connection being
torn down, a stream the remote's swarm refused); nothing of the request was sent, so a retry
cannot deliver it twice. A protocol the remote does not serve, or a negotiation timeout, is
not retried.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from exo_p2p import defaults

from .errors import NetError, RemoteError, RequestError
from .framing import (
    STATUS_ERROR,
    STATUS_OK,
    FrameError,
    FrameTooLarge,
    read_frame,
    write_frame,
)

log = structlog.get_logger(__name__)

RequestHandler = Callable[[str, bytes], Awaitable[bytes]]
Counter = Callable[[str], None]


async def serve_stream(
    stream: INetStream,
    handler: RequestHandler,
    *,
    read_timeout: float,
    handler_timeout: float,
    max_frame_bytes: int,
    count: Counter,
) -> None:
    """Answer one request on ``stream``. Never raises (except Cancelled); failures are counted:
    ``request_idle_dropped``, ``request_too_large``, ``request_bad_frame``,
    ``request_handler_error``, ``request_handler_timeout``, ``response_write_timeout``,
    ``request_stream_error``."""
    peer_id = str(stream.muxed_conn.peer_id)
    try:
        with trio.move_on_after(read_timeout) as scope:
            request = await read_frame(stream, max_frame_bytes)
        if scope.cancelled_caught:
            count("request_idle_dropped")
            log.info("dropped silent request stream", peer=peer_id)
            await reset_quietly(stream)
            return
        status, reply = STATUS_OK, b""
        with trio.move_on_after(handler_timeout) as hscope:
            try:
                reply = await handler(peer_id, request)
            except Exception as exc:
                count("request_handler_error")
                status, reply = STATUS_ERROR, repr(exc).encode()
        if hscope.cancelled_caught:
            count("request_handler_timeout")
            status, reply = STATUS_ERROR, f"handler timed out after {handler_timeout} s".encode()
        with trio.fail_after(read_timeout):
            await write_frame(stream, bytes([status]) + reply, max_frame_bytes + 1)
            await stream.close()
    except FrameTooLarge:
        count("request_too_large")
        await reset_quietly(stream)
    except FrameError:
        count("request_bad_frame")
        await reset_quietly(stream)
    except trio.TooSlowError:
        count("response_write_timeout")
        await reset_quietly(stream)
    except Exception as exc:
        count("request_stream_error")
        log.debug("request stream failed", peer=peer_id, error=repr(exc))
        await reset_quietly(stream)


async def send_request(
    host: IHost,
    peer_id: str,
    protocol: str,
    data: bytes,
    *,
    timeout: float,
    max_frame_bytes: int,
) -> bytes:
    """Send one request and return the reply bytes (see ``Network.request``)."""
    if len(data) > max_frame_bytes:
        raise FrameTooLarge(f"request of {len(data)} bytes exceeds {max_frame_bytes}")
    stream: INetStream | None = None
    try:
        with trio.fail_after(timeout):
            stream = await open_stream(host, peer_id, protocol)
            await write_frame(stream, data, max_frame_bytes)
            reply = await read_frame(stream, max_frame_bytes + 1)
            await stream.close()
            stream = None
    except trio.TooSlowError as exc:
        raise RequestError(f"request {protocol} to {peer_id} timed out after {timeout} s") from exc
    except (FrameError, NetError) as exc:
        raise RequestError(f"request {protocol} to {peer_id}: {exc}") from exc
    except Exception as exc:
        raise RequestError(f"request {protocol} to {peer_id} failed: {exc!r}") from exc
    finally:
        if stream is not None:
            await reset_quietly(stream)
    if not reply:
        raise RequestError(f"empty reply from {peer_id}")
    if reply[0] != STATUS_OK:
        raise RemoteError(reply[1:].decode(errors="replace"))
    return reply[1:]


def stream_died_at_once(exc: BaseException) -> bool:
    """Whether a failed ``new_stream`` is one the module docstring retries: the multistream
    handshake could not be read or written (the stream was reset, or its connection closed),
    or the swarm's connection closed under the new stream. Not a failed dial (the peer is
    unreachable: a retry would only wait), not an unsupported protocol, not a timeout."""
    from libp2p.network.exceptions import SwarmException
    from libp2p.network.swarm import SwarmDialAllFailedError
    from libp2p.protocol_muxer.exceptions import MultiselectClientError

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, MultiselectClientError):
            return str(cur).startswith("handshake ")
        if isinstance(cur, SwarmDialAllFailedError):
            return False
        if isinstance(cur, SwarmException):
            return "connection" in str(cur).lower() or "create stream" in str(cur).lower()
        cur = cur.__cause__ or cur.__context__
    return False


async def open_stream(host: IHost, peer_id: str, protocol: str) -> INetStream:
    """``host.new_stream`` to ``peer_id`` on ``protocol``, tried again when it died at once
    (module docstring). The caller bounds the time; raises the last failure."""
    for attempt in range(1, defaults.STREAM_OPEN_ATTEMPTS + 1):
        try:
            return await host.new_stream(ID.from_base58(peer_id), [TProtocol(protocol)])
        except Exception as exc:
            if attempt == defaults.STREAM_OPEN_ATTEMPTS or not stream_died_at_once(exc):
                raise
            log.debug("stream died at once; trying again", peer=peer_id, protocol=protocol, attempt=attempt, error=repr(exc))
        await trio.sleep(defaults.STREAM_RETRY_PAUSE)
    raise AssertionError("unreachable")


async def reset_quietly(stream: INetStream) -> None:
    """Reset a stream, ignoring errors, bounded to 1 s even while cancelled."""
    with trio.CancelScope(shield=True), trio.move_on_after(1.0):
        try:
            await stream.reset()
        except Exception:
            pass
