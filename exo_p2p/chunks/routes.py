"""Where a task's chunks travel between nodes: rank 0's node sends each chunk its runner
streams to the API node that owns the request (here, or over a direct stream to that node;
never through gossip), and the API node admits chunks only from rank 0 of the task's
instance (docs/architecture.md#request-flow, step 5). Delivery in order and once is
``exo_p2p.chunks.order`` and ``exo_p2p.chunks.router``'s; this module decides who sends to whom."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Literal

import structlog
import trio

from exo_p2p.chunks.order import ChunkNumbering
from exo_p2p.chunks.router import ChunkRouter
from exo_p2p.cluster.faults import FaultyChunkSender, chunk_faults_from_hooks
from exo_p2p.types import Chunk, IndexedEvent, State, TaskCreated

log = structlog.get_logger("exo_p2p.node")

SendChunk = Callable[[str, Chunk, int], None]
"""``send(destination node id, chunk, position)``: the cluster member's ``send_chunk``."""

TABLE_MAX = 100_000
"""Tasks remembered per table at most; beyond it the oldest half is forgotten."""

Admission = Literal["deliver", "unnumbered", "refused"]


def admission(rank0: str | None, peer: str, numbered: bool) -> Admission:
    """What the API node does with a chunk ``peer`` sent: ``"refused"`` when the task's
    rank 0 is known and is another node (no other node may write into a client's stream),
    ``"unnumbered"`` when the batch lacks a position for each chunk (it cannot be put in
    order), else ``"deliver"``. A task whose ``TaskCreated`` this node has not applied yet
    (``rank0`` None: its log lags rank 0's by a moment) is admitted: the router only
    delivers to requests this node opened."""
    if rank0 is not None and rank0 != peer:
        return "refused"
    return "deliver" if numbered else "unnumbered"


def trim_oldest(table: MutableMapping[str, str], limit: int = TABLE_MAX) -> None:
    """Forget the oldest half of ``table`` (insertion order) once it holds more than
    ``limit`` entries: the task tables stay bounded however long the node runs."""
    if len(table) > limit:
        for key in list(table)[: limit // 2]:
            del table[key]


class ChunkRoutes:
    """The node's chunk routes, learnt from the ``TaskCreated`` events it applies: each
    task's API node (where its chunks go) and rank 0's node (the one node they may come
    from). ``on_event`` is a replica listener; ``route`` is the worker's chunk sink;
    ``receive`` is the cluster member's ``on_chunks``. ``refused`` counts the chunks
    refused as not from rank 0 (``chunk_not_from_rank0`` in ``GET /state``)."""

    def __init__(self, node_id: str, state: Callable[[], State], router: ChunkRouter) -> None:
        self.node_id = node_id
        self._state = state
        self.router = router
        self.refused = 0
        self._api_node: dict[str, str] = {}
        self._rank0: dict[str, str] = {}
        self._numbering = ChunkNumbering()
        self._send: SendChunk | None = None

    def on_event(self, indexed: IndexedEvent, state: State) -> None:
        """Replica listener: remember a created task's API node and rank 0's node."""
        event = indexed.event
        if isinstance(event, TaskCreated):
            self._api_node[event.task.task_id] = event.task.api_node_id
            instance = state.instances.get(event.task.instance_id)  # type: ignore[call-overload]
            if instance is not None and instance.shards:
                self._rank0[event.task.task_id] = instance.shards[0].node_id
            for table in (self._api_node, self._rank0):
                trim_oldest(table)

    def route(self, chunk: Chunk) -> None:
        """Hand a runner's chunk to the API node that owns its request (here, or numbered
        and sent over a direct stream to that node; never through gossip). Before ``bind``
        only chunks of this node's own requests can go."""
        destination = self._api_node.get(chunk.task_id)
        if destination is None:
            record = self._state().tasks.get(chunk.task_id)  # type: ignore[call-overload]
            destination = record.task.api_node_id if record is not None else self.node_id
        if destination == self.node_id:
            self.router.deliver(chunk)
        else:
            self._send(destination, chunk, self._numbering.number(chunk))  # type: ignore[misc]

    def receive(self, peer: str, chunks: list[Chunk], seqs: list[int]) -> None:
        """Chunks from ``peer``, ``seqs[i]`` the position of ``chunks[i]``: delivered (in
        position order, each once: ``exo_p2p.chunks.order``) when ``admission`` says so, else
        counted as undeliverable (and as refused when not from rank 0)."""
        numbered = len(seqs) == len(chunks) and all(s >= 1 for s in seqs)
        for i, chunk in enumerate(chunks):
            verdict = admission(self._rank0.get(chunk.task_id), peer, numbered)
            if verdict == "deliver":
                self.router.deliver(chunk, seqs[i])
                continue
            self.router.undeliverable += 1
            if verdict == "refused":
                self.refused += 1

    def bind(self, send: SendChunk, counters: MutableMapping[str, int], fault_hooks: dict[str, str], nursery: trio.Nursery) -> None:
        """Send through ``send`` (the cluster member's ``send_chunk``). Tests only: with
        ``chunk_*`` fault hooks, the chunks this node sends to other nodes are dropped,
        duplicated and reordered (``cluster.faults.FaultyChunkSender``, its background task
        started in ``nursery``, its counts added to ``counters`` as ``fault_KIND:chunks``)."""
        self._send = send
        faults = chunk_faults_from_hooks(fault_hooks)
        if faults is None:
            return
        log.warning("chunk fault injection on (tests only)", drop=faults.drop, dup=faults.dup, reorder=faults.reorder)

        def count(kind: str, n: int) -> None:
            key = f"fault_{kind}:chunks"
            counters[key] = counters.get(key, 0) + n

        sender = FaultyChunkSender(send, faults, on_count=count)  # type: ignore[arg-type]
        self._send = sender
        nursery.start_soon(sender.run)
