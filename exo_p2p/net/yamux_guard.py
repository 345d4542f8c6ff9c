"""Whole messages on yamux streams: a message is written entirely, or the stream is reset.

py-libp2p 0.8.1's ``YamuxStream.write(data)`` sends ``data`` as frames of at most the send
window and 64 KiB, taking the stream's write lock for each *frame*, not for the message. Two
consequences break a stream that carries length-prefixed messages (pubsub RPCs, our
request/response frames):

- **Interleaving.** Two tasks writing to one stream at once (a pubsub peer's queue sender and
  a gossip heartbeat's control message, say) interleave their frames, so the peer reads a
  length prefix followed by bytes of another message.
- **Half a message.** When the peer's receive window stays closed for 5 s (a peer busy on a
  loaded machine) the write raises ``MuxedStreamError`` after some frames went out; the stream
  stays open with half a message in it, and the next message written is read as its rest.

Either way the peer's reader parses garbage: pubsub's read loop dies on a protobuf
``DecodeError``, which ends the task serving the whole connection (seen under a flood of the
largest requests on a loaded 2-core machine: "Swarm: task start exited with error ...
DecodeError: Error parsing message with type 'pubsub.pb.RPC'", then requests unanswered until
the peers reconnected).

``install()`` wraps ``YamuxStream.write`` so that one message is written at a time per stream
(a lock per stream around the whole write) and a write that fails (perhaps after part of the
message went out) resets the stream: the peer sees a reset (a closed stream, which every reader
handles) instead of a desynchronised one. Installed once per process by ``open_host``.
"""

from __future__ import annotations

import structlog
import trio

log = structlog.get_logger(__name__)

_LOCK_ATTR = "_exo_message_lock"
RESET_WAIT = 1.0
"""Seconds a reset may take at most (its frame waits for the connection's writer; shielded
from the cancellation that may have ended the write, so it needs its own bound)."""
_state: dict[str, object] = {}
"""``original``: the unwrapped ``YamuxStream.write``; ``resets``: streams reset after a failed write."""


def _message_lock(stream: object) -> trio.Lock:
    lock = stream.__dict__.get(_LOCK_ATTR)
    if lock is None:
        lock = stream.__dict__[_LOCK_ATTR] = trio.Lock()
    return lock


def install() -> None:
    """Wrap ``YamuxStream.write`` (idempotent; see the module docstring). A write that
    raises (a closed window for 5 s, a cancellation, a connection error) on a stream not
    closed yet resets it: whether part of the message left cannot be told from outside, and a
    stream that may hold half a message must not carry another."""
    from libp2p.stream_muxer.yamux.yamux import YamuxStream

    if "original" in _state:
        return
    original = YamuxStream.write
    _state["original"], _state["resets"] = original, 0

    async def write(self: YamuxStream, data: bytes) -> None:
        async with _message_lock(self):
            try:
                await original(self, data)
            except BaseException:
                if not self.closed:
                    _state["resets"] = resets() + 1
                    log.info("yamux stream reset after a failed write", stream=self.stream_id, bytes=len(data))
                    with trio.CancelScope(shield=True, deadline=trio.current_time() + RESET_WAIT):
                        try:
                            await self.reset()
                        except Exception:  # noqa: BLE001 - the connection is going away anyway
                            pass
                raise

    YamuxStream.write = write  # type: ignore[method-assign]


def resets() -> int:
    """Streams reset after a failed write in this process (0 before ``install``)."""
    return int(_state.get("resets", 0))  # type: ignore[call-overload]
