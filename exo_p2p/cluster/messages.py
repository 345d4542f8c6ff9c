"""Messages nodes exchange to form a cluster (docs/architecture.md#request-flow).

Gossip carries only small messages (heartbeats, local events, indexed events); anything
large or that must arrive goes over a request/response stream: commands, log catch-up,
snapshots, token chunks. Every message has the protocol version; one that does not decode,
or has another version, is dropped and counted.
"""

from __future__ import annotations

import msgspec

from exo_p2p.types import PROTOCOL_VERSION, Chunk, IndexedEvent, LocalEvent, State

HEARTBEATS_TOPIC = "exo-p2p/heartbeats/1"
LOCAL_EVENTS_TOPIC = "exo-p2p/local-events/1"
GLOBAL_EVENTS_TOPIC = "exo-p2p/global-events/1"

COMMAND_PROTOCOL = "/exo-p2p/command/1"
LOG_PROTOCOL = "/exo-p2p/log/1"
CHUNKS_PROTOCOL = "/exo-p2p/chunks/1"
EVENTS_PROTOCOL = "/exo-p2p/events/1"
LOCAL_EVENTS_PROTOCOL = "/exo-p2p/local-events/1"
"""A re-sent ``LocalEventBatch`` straight to the master (answer ``b"ok"``, or ``b"not_master"``):
a local event not seen indexed after one gossip attempt does not wait for GossipSub."""
HEARTBEAT_PROTOCOL = "/exo-p2p/heartbeat/1"
"""A follower's heartbeat sent straight to its master (``HeartbeatAck`` back), so liveness
does not depend on GossipSub admitting the follower to the master's mesh."""


class Heartbeat(msgspec.Struct, frozen=True):
    """What a node says of itself every heartbeat interval.

    ``master`` is the node it follows (itself when it is master), ``term`` that master's
    term, ``last_idx``/``last_term`` the last event it applied, ``priority`` its election
    priority (``--priority``).

    ``commit_idx``: for a master, the highest index it knows committed (applied by a live
    follower, or persisted when it is alone; ``election.master_rank`` compares it when two
    masters meet); for a follower, its ``last_idx``. ``followers``: for a master, how many
    live peers follow it (shown in logs; the election counts support from the heartbeats it
    holds). ``chain``: the chain digest of this node's log at ``last_idx``
    (``exo_p2p.state.chain``, 16 bytes; empty at 0), so a receiver can tell whether a claimer's
    log is a prefix of its own (``cluster.claims``). ``seq``: how many heartbeats this boot of the
    sender had made before this one (a counter, no time): a receiver keeps the latest one it
    was *sent*, not the latest to arrive (GossipSub replays recent messages to a peer that
    just joined, so an older heartbeat can arrive after a newer one; 0 from an older sender).
    ``lag_ms``: the longest stall of the sender's own event loop in the last
    ``LAG_REPORT_WINDOW`` s, in milliseconds (its host is busy: receivers wait that much longer
    before they count it gone, ``cluster.liveness``; 0 from an older sender)."""

    node_id: str
    boot_id: str
    term: int
    master: str | None
    priority: int
    last_idx: int
    last_term: int
    version: int = PROTOCOL_VERSION
    commit_idx: int = 0
    followers: int = 0
    chain: bytes = b""
    seq: int = 0
    lag_ms: int = 0


class HeartbeatAck(msgspec.Struct, frozen=True):
    """The answer to a direct heartbeat: the answering node's own heartbeat, and whether it
    heard the asker's gossiped heartbeat recently (``gossip_fresh``; when not, the asker
    sends its heartbeat directly every heartbeat interval)."""

    heartbeat: Heartbeat
    gossip_fresh: bool
    version: int = PROTOCOL_VERSION


class LocalEventBatch(msgspec.Struct, frozen=True):
    """Local events of one origin, re-sent until seen indexed."""

    events: tuple[LocalEvent, ...]
    version: int = PROTOCOL_VERSION


class IndexedEventBatch(msgspec.Struct, frozen=True):
    """Consecutive indexed events the master publishes in one gossip message (the events
    one command or local event produced, or whatever queued while the previous message was
    being sent), in index order. Receivers also accept a bare ``IndexedEvent``."""

    events: tuple[IndexedEvent, ...]
    version: int = PROTOCOL_VERSION


class LogRequest(msgspec.Struct, frozen=True):
    """Ask for indexed events ``from_idx..`` (at most ``max_events``). ``prev_idx``/
    ``prev_term``/``prev_chain`` identify the asker's last event and its log's chain digest
    there (``exo_p2p.state.chain``, 16 bytes; empty: not checked): if the responder's log has
    another term or another digest there, the asker's tail diverged and it gets a snapshot
    instead (terms alone can collide when two cut-off nodes claimed the same term)."""

    from_idx: int
    max_events: int = 5000
    prev_idx: int = 0
    prev_term: int = 0
    prev_chain: bytes = b""
    version: int = PROTOCOL_VERSION


class LogResponse(msgspec.Struct, frozen=True):
    """Events in index order, or a snapshot (State as of ``snapshot.last_event_idx``) when
    the asked range is compacted away or the asker diverged (``snapshot_chain``: the
    responder's chain digest at the snapshot's index); ``last_idx`` is the responder's last
    applied index."""

    events: tuple[IndexedEvent, ...] = ()
    snapshot: State | None = None
    last_idx: int = 0
    snapshot_chain: bytes = b""
    version: int = PROTOCOL_VERSION
    diverged: bool = False
    """With a snapshot: sent because the asker's tail is not in the responder's log (False:
    because the asked range is compacted away)."""


class ChunkBatch(msgspec.Struct, frozen=True):
    """Chunks for requests owned by the receiving node, in order per task; ``seqs[i]`` is
    the position of ``chunks[i]`` in its task's stream (``exo_p2p.chunks.order``; a batch
    whose chunks are not all numbered is not delivered)."""

    chunks: tuple[Chunk, ...]
    seqs: tuple[int, ...] = ()
    version: int = PROTOCOL_VERSION


heartbeat_decoder = msgspec.msgpack.Decoder(Heartbeat)
heartbeat_ack_decoder = msgspec.msgpack.Decoder(HeartbeatAck)
local_batch_decoder = msgspec.msgpack.Decoder(LocalEventBatch)
indexed_decoder = msgspec.msgpack.Decoder(IndexedEvent)
indexed_batch_decoder = msgspec.msgpack.Decoder(IndexedEventBatch)
log_request_decoder = msgspec.msgpack.Decoder(LogRequest)
log_response_decoder = msgspec.msgpack.Decoder(LogResponse)
chunk_batch_decoder = msgspec.msgpack.Decoder(ChunkBatch)
encode = msgspec.msgpack.Encoder().encode


def decode_global(data: bytes) -> IndexedEventBatch:
    """A global-events gossip message as a batch: an ``IndexedEventBatch``, or a bare
    ``IndexedEvent`` (a batch of one with that event's version). Raises msgspec.DecodeError
    when it is neither."""
    try:
        return indexed_batch_decoder.decode(data)
    except msgspec.DecodeError:
        single = indexed_decoder.decode(data)
        return IndexedEventBatch((single,), version=single.version)
