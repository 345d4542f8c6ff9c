"""Every time bound and size default of the cluster core, named once with its unit and why.

The cluster modules (``exo_p2p.cluster``) and ``ClusterSettings`` read these; the defaults
tables of docs/cluster.md and docs/architecture.md ("Defaults") quote them. Times are seconds of this
node's monotonic clock (heartbeats carry no time); sizes are counts or bytes as named.
Pure data: no imports, so any layer may read it.
"""

from __future__ import annotations

# --- liveness ---------------------------------------------------------------------------------
HEARTBEAT_INTERVAL = 0.5
"""Seconds between two heartbeats of a node (gossiped, and direct to the master)."""
HEARTBEAT_MIN_GAP = 0.1
"""Seconds between two heartbeats at least, even when a change asks for one at once: at most
10 heartbeats/s, as a gossiped heartbeat costs each receiver ~4 ms of CPU."""
COMMIT_ACKERS = 3
"""Followers that gossip a heartbeat at once after applying an event, so the master learns
promptly that the event is committed (``cluster.heartbeats.acks_commits``). The commit needs
one follower's word; when every follower did this, each event made every node receive N
heartbeats (10 × N/s under load: ~2,500/s at 256 nodes). The others report in their next
regular heartbeat (``HEARTBEAT_INTERVAL``)."""
PEER_TIMEOUT = 5.0
"""Seconds without a heartbeat after which a peer is gone (ten lost heartbeats)."""
LISTEN_AFTER_STALL = 1.5
"""Seconds this node's own loop must have run since a peer was last heard before it counts
that peer gone (``cluster.liveness.gone_silent``): three heartbeat intervals, at most one of
them before a stall (a live peer is heard every interval), so at least two after it to read
what waited in its sockets while it was stopped or starved."""
LAG_REPORT_WINDOW = 60.0
"""Seconds back a heartbeat's ``lag_ms`` looks: the longest own loop stall that ended within
them (a host starved of CPU stalls again and again; its peers wait that much longer)."""
MAX_REPORTED_LAG_MS = 60_000
"""The largest ``Heartbeat.lag_ms`` a node sends (a receiver grants at most ``PEER_TIMEOUT``)."""
DIRECT_HEARTBEAT_TIMEOUT = 2.0
"""Seconds a direct heartbeat to the master may take at most (and at most half ``PEER_TIMEOUT``)."""
DISCONNECTED_TIMEOUT = 2.5
"""Seconds after which the master times out a node it has no connection to and has not heard
from (five lost heartbeats; a killed node's connection closes within ~0.2 s, a live one is
still heard through gossip relayed by other peers and redials within a second)."""
DISCONNECT_GRACE = 1.0
"""Seconds a peer whose last connection closed still counts as reachable: a killed process
is noticed in ~0.2 s, a brief reconnect is tolerated."""

# --- election ---------------------------------------------------------------------------------
START_SETTLE = 2.0
"""Seconds a masterless node waits after it starts before an election, so the heartbeats of
an existing master reach it first."""
KNOWN_SETTLE = 5.0
"""``START_SETTLE`` for a node whose State lists other nodes: its dials to their known
addresses get time before it may claim a term they may have used."""
FAILOVER_SETTLE = 0.5
"""Seconds to wait after losing a master before electing (every node decides alike)."""
ELECTION_TICK = 0.1
"""Seconds between two passes of the election loop."""
CLAIM_PROBE_TIMEOUT = 3.0
"""Seconds a node waits for a master claimer to answer for its log (``cluster.claims``)."""
CLAIM_RECHECK_AFTER = 5.0
"""Seconds after which a refused master claim is probed again (the claimer may have caught up)."""
RIVAL_YIELD_AFTER = 2 * CLAIM_RECHECK_AFTER + CLAIM_PROBE_TIMEOUT
"""Seconds a master keeps its seat while a rival master it admits and outranks keeps claiming
(``election.election_step``, rule 4): then it yields to the rival, which refuses this
master's claim. Longer than a loser's two probes of the winner (a first one may go unanswered
on a busy host), so a rival that merely has not admitted the winner yet is not yielded to."""

# --- local events and the replicated log --------------------------------------------------------
RESEND_INTERVAL = 1.0
"""Seconds after which a local event not seen indexed is sent again."""
DIRECT_SEND_TIMEOUT = 3.0
"""Seconds a re-send of local events over a direct stream to the master may take."""
REQUEST_TIMEOUT = 10.0
"""Seconds a log fetch request may take."""
MAX_LOCAL_BATCH = 64
"""Local events per gossip message or direct request at most."""
MAX_GLOBAL_BATCH = 64
"""Indexed events per gossip message at most (a burst is published as one message)."""
MAX_OUTBOX = 4096
"""Indexed events waiting to be published at most; beyond it the master's sequencing waits."""
LOG_SYNC_POLL = 1.0
"""Seconds between two checks of a follower that it is not behind its master."""
LOG_FETCH_FALLBACK_PEERS = 3
"""Peers following the same master asked for the log when the master is unreachable."""
LOG_FETCH_MAX_ROUNDS = 1000
"""Requests of one catch-up at most (each returns up to ``LOG_SERVE_MAX_EVENTS`` events and
``LOG_SERVE_MAX_BYTES`` bytes)."""
LOG_SERVE_MAX_EVENTS = 5000
"""Events one log response carries at most."""
LOG_SERVE_MAX_BYTES = 4 * 1024 * 1024
"""Bytes of events (their frames in the log) one log response carries at most, and at least
one event: a follower far behind catches up in several requests of ~4 MiB, never one frame of
tens of MiB (5,000 events of ~130 KiB, the largest a request makes, would exceed the 64 MiB
request frame). Each response costs both ends tens of milliseconds to encode, decode and
apply, so the heartbeats sharing its connection and event loop wait that long at most."""
LOG_COMPACT_EVENTS = 20_000
"""Events in a node's log at which it is compacted into the snapshot (``--compact-every``)."""
LOG_COMPACT_BYTES = 16 * 1024 * 1024
"""Bytes of a node's log (``events.log``) at which it is compacted, whatever the count: ~125
requests of the largest size a request may have (~130 KiB of log each), 20-30 s of a flood of
them against a 2-node cluster on 2 shared cores (measured 4.5-6.5 requests/s); the log file
stays below this plus one applied batch (at most one log response, ``LOG_SERVE_MAX_BYTES``),
and so does the memory its events take."""
TIMEOUT_CHECK_INTERVAL = 0.5
"""Seconds between two checks of the master for nodes to time out."""
COMMIT_POLL = 0.05
"""Seconds between two checks of ``wait_committed`` when no heartbeat arrives."""

# --- subscriptions (messages buffered per topic before the receiver reads them) ----------------
HEARTBEATS_BUFFER = 4096
LOCAL_EVENTS_BUFFER = 4096
GLOBAL_EVENTS_BUFFER = 8192

# --- dials (exo_p2p.net.host_build, exo_p2p.net.dialer) --------------------------------------------
DIAL_RETRIES = 1
"""Retries of one address within one dial (the swarm's own; our re-dialler and mesh keeper
back off across dials). py-libp2p's default of 3 held a dial to a stale address (a peer that
restarted on a new port) 1-2 s, and every other dial of that peer waited behind it."""
DIAL_RETRY_DELAY = 0.05
"""Seconds before that retry."""

# --- request streams (exo_p2p.net.reqresp) -----------------------------------------------------
STREAM_OPEN_ATTEMPTS = 3
"""Tries to open a request stream whose negotiation died at once (the remote reset it before
answering the multistream handshake, or its connection closed under it), within the
request's own timeout. Safe: nothing of the request was sent yet."""
STREAM_RETRY_PAUSE = 0.1
"""Seconds between two tries to open a request stream (a closing connection is gone by then,
and the next try dials a fresh one)."""

# --- mesh and topology edges --------------------------------------------------------------------
MESH_TICK = 0.5
"""Seconds between two passes over the nodes in State to dial."""
MESH_DIAL_TIMEOUT = 3.0
"""Seconds one dial of a peer's address may take."""
MESH_STAGGER = 3.0
"""Seconds the larger node id waits before dialling a new node (the smaller dials first, so a
pair does not open two connections at once)."""
MESH_BACKOFF_FIRST = 0.5
"""Seconds before the second dial of an unreachable node (doubling after each failure)."""
MESH_BACKOFF_MAX = 30.0
"""Seconds between dials of an unreachable node at most."""
EDGE_RECONCILE_PERIOD = 1.0
"""Seconds between two comparisons of State's edges from this node with its connections."""
EDGE_RETRACT_GRACE = 2.0
"""Seconds a peer stays disconnected before its edge is retracted (a replaced connection or a
hiccup is not a topology change worth two events)."""
EDGE_ADDRESS_POLL = 0.2
"""Seconds between two looks for a connected peer's IP address."""
EDGE_BATCH_WAIT = 0.1
"""Seconds a new edge waits for others before they are announced together in one
``TopologyEdgesCreated`` (a node joining N peers sends a few events, not N)."""
EDGE_ADDRESS_WAIT = 10.0
"""Seconds to wait for a peer's IP address before giving up its edge (logged)."""

# --- commands --------------------------------------------------------------------------------
COMMAND_TIMEOUT = 30.0
"""Seconds a command may take, failovers included; then a 503 ``no_master`` result."""
COMMAND_SERVE_SLACK = 5.0
"""Seconds the master's command handler gets beyond ``COMMAND_TIMEOUT``."""
COMMAND_RETRY_PAUSE = 0.2
"""Seconds before a command is sent again after the master did not answer."""
NOT_MASTER_PAUSE = 0.1
"""Seconds before a command refused by a former master is sent again."""
NOT_MEMBER_MIN_LEFT = 0.3
"""Seconds of the command's time that must be left to retry a ``not_member`` refusal (this
node's profile may not be indexed yet)."""
COMMAND_APPLY_WAIT = 5.0
"""Seconds a command's caller waits for its event to be applied here at most."""

# --- chunks ------------------------------------------------------------------------------------
CHUNK_BATCH_MAX = 256
"""Chunks per direct request at most."""
CHUNK_BATCH_BYTES = 16 * 1024 * 1024
"""Bytes of chunk payload (``exo_p2p.cluster.chunks.chunk_bytes``) per direct request at
most, a quarter of the request frame bound (``NetConfig.max_frame_bytes``, 64 MiB); a chunk
larger on its own travels alone (an ``EmbeddingChunk`` is at most ``EMBEDDING_CHUNK_BYTES``)."""
CHUNK_ATTEMPTS = 3
"""Tries of one chunk batch before it is counted lost (``chunks_lost``)."""
CHUNK_REQUEST_TIMEOUT = 5.0
"""Seconds one chunk batch request may take."""
CHUNK_RETRY_PAUSE = 0.2
"""Seconds between two tries of a chunk batch."""

# --- models travelling between nodes (docs/models.md; rules: exo_p2p.models.transfer.fetch, master.placement.fetch)
MODEL_STREAMS_PER_PEER = 2
"""Chunk requests in flight per holder during one fetch."""
MODEL_CHUNK_TIMEOUT = 30.0
"""Seconds one chunk request may take; then the chunk goes to another holder."""
MODEL_MAX_PEER_FAILURES = 2
"""Failed chunk requests in a row after which a holder is dropped for the rest of a fetch."""
MODEL_MANIFEST_TIMEOUT = 30.0
"""Seconds to get a manifest from one holder."""
MODEL_FETCH_ROUNDS = 3
"""Rounds of a shard fetch (each re-reads the holders from State); then the runner fails with the reason."""
MODEL_FETCH_ROUND_PAUSE = 2.0
"""Seconds between two rounds of a shard fetch (new holders get time to be published)."""
FETCH_DISK_HEADROOM_PERCENT = 10
"""Percent of a shard's bytes a fetching node needs free on disk beyond them."""


def disk_needed(fetch_bytes: int) -> int:
    """Free disk bytes a node needs to fetch ``fetch_bytes``: plus ``FETCH_DISK_HEADROOM_PERCENT``,
    rounded up (integers). One rule for a placement's fetch (``master.placement.fetch``) and
    a pull (``exo_p2p.models.depot.pulls``)."""
    return -(-fetch_bytes * (100 + FETCH_DISK_HEADROOM_PERCENT) // 100)

# --- the engine (worker.engine; the record: exo_p2p.types.engine.EngineSettings) ---------------
PREFILL_CHUNK_SIZE = 32
"""Prompt tokens per prefill step (tokens): agreement rounds, cancels and joining requests
wait at most one chunk's prefill, and a chunk must stay well under the runner's silence bound
(``config.RUNNER_SILENT_GENERATING``) on the slowest rank: ~32 tokens is 3-6 s for SmolLM2 on
a loaded 2-core CPU. The master fixes it per instance."""
MAX_BATCH = 16
"""Sequences a runner decodes together in one forward pass (1: one request at a time)."""
PROMPT_CACHE_BYTES = 0
"""Bytes of finished conversations' KV an engine keeps for reuse (0: no prompt cache): the
default of ``EngineSettings`` (an engine built in process); a node's is
``NODE_PROMPT_CACHE_BYTES``."""
NODE_PROMPT_CACHE_BYTES = 256 * 1024 * 1024
"""A node's ``--prompt-cache-bytes`` by default: a chat's next turn and an agent's next step
reuse the previous one's KV. A runner keeps at most a quarter of its KV budget for it
(``EngineSettings.for_runner``), so a small machine keeps most of its memory for the batch."""
