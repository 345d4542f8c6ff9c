"""The composition root: one ``exo-p2p node`` process (docs/architecture.md#layers).

Wires the libp2p host, the cluster membership (heartbeats, election, log replication),
the replica of the event log, the master role (while this node is master), the worker and
the HTTP API in one trio process. This is the only module that imports both ``master`` and
``worker``.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from pathlib import Path

import msgspec
import structlog
import trio

from exo_p2p.announce import (banner, from_before_fact, instances_from_before, membership_fact, no_peers_warning,
                              secret_fact, still_coming)
from exo_p2p.api.backend import LinkSummary, NodeHealth, NodeSummary
from exo_p2p.api.generation import GenerationSettings
from exo_p2p.loop_watch import LoopWatch
from exo_p2p.preload_gate import settled
from exo_p2p.chunk_order import ChunkNumbering
from exo_p2p.chunk_router import ChunkRouter
from exo_p2p.config import NO_PEERS_WARNING_AFTER, NodeConfig
from exo_p2p.orphans import OrphanSweeper
from exo_p2p.replica import Replica
from exo_p2p.types import (
    Chunk,
    Command,
    CommandResult,
    ErrorInfo,
    Event,
    IndexedEvent,
    LocalEvent,
    MasterElected,
    ModelCard,
    NetworkAddress,
    NodeModelsUpdated,
    NodeProfile,
    NodeProfileUpdated,
    State,
    TaskCreated,
)

log = structlog.get_logger(__name__)


def interface_type(ip: str) -> str:
    """Interface kind for an IPv4 address as far as the address alone tells."""
    return "loopback" if ip.startswith("127.") else "other"


def _address_of(multiaddr: str) -> NetworkAddress:
    parts = multiaddr.split("/")
    ip = parts[2] if len(parts) > 2 else ""
    return NetworkAddress(multiaddr=multiaddr, ip=ip, interface="", interface_type=interface_type(ip))  # type: ignore[arg-type]


class Node:
    """One node process. ``await Node(config).run()`` serves until cancelled or signalled."""

    def __init__(self, config: NodeConfig) -> None:
        """Build every part that needs no network: identity, replica, model store, worker and
        the master hooks. ``run`` opens the libp2p host and builds the cluster member on it.
        Raises ``OSError`` when the data dir cannot be read."""
        from exo_p2p.cluster.member import ClusterMember, MasterHooks
        from exo_p2p.models.store import ModelStore, store_roots
        from exo_p2p.models.token_count import TokenCounter
        from exo_p2p.net import Network, load_or_create_identity, new_boot_id
        from master.role import MasterRole
        from worker.worker import Worker

        self.config = config
        self.data_dir = Path(config.data_dir)
        self.router = ChunkRouter()
        self.started = trio.Event()
        self.exit_reason: str | None = None
        """Why the node gave up (a duplicate identity), or None."""
        self.api_port: int | None = None
        self.chunks_refused = 0
        self._task_api_node: dict[str, str] = {}
        self._task_rank0: dict[str, str] = {}
        self._chunk_numbering = ChunkNumbering()
        self._local_cards: list[ModelCard] = []
        # identity and storage
        self.identity = load_or_create_identity(self.data_dir, new=config.new_identity)
        self.node_id: str = self.identity.node_id
        self.boot_id: str = new_boot_id()
        self.replica = Replica(self.data_dir / "events.log", compact_every=config.compact_every)
        self._from_before = instances_from_before(self.replica.state, self.node_id, self.boot_id)  # said at start
        self.orphans = OrphanSweeper(self.node_id, lambda: self.replica.state, self.router.open_task_ids, self.command)
        self.loop_watch = LoopWatch()  # loop lag and slow task steps: GET /state counters, the log
        self.store = ModelStore(self.data_dir, [Path(p) for p in config.models_dirs]
                                + [self.data_dir / "models" / "pulled"],  # pulled from peers (docs/models.md)
                                **store_roots(config))  # Ollama, LM Studio: docs/models.md#model-stores
        from exo_p2p.models.depot import ModelDepot

        self.depot = ModelDepot(self.store, self.data_dir, fault_hooks=config.fault_hooks)
        from exo_p2p.models.hub_fetch import HubAccess

        self.hub = HubAccess(offline=config.offline, node_id=self.node_id)  # docs/models.md#models-from-a-hub
        # the worker, fed by the replica
        self.worker = Worker(
            self.node_id,
            self.boot_id,
            self.state,
            self.emit_local,
            self.route_chunk,
            lambda model_id: self.store.resolve(model_id),
            engine=config.engine,
            fault_hooks=config.fault_hooks,
            runner_env=self._runner_environment(),
            fetch_shard=self._fetch_shard,  # a shard of a model this node lacks (docs/models.md)
        )
        self.replica.listeners.append(self._track_tasks)
        self.replica.listeners.append(self.router.on_event)
        self.replica.snapshot_listeners.append(lambda _s: self.worker.wake())
        self.replica.listeners.append(lambda _e, _s: self.worker.wake())
        # tokenizers for counting tokens, loaded while an instance placed here loads
        self.tokens = TokenCounter(self.store.resolve)
        self.replica.snapshot_listeners.append(lambda _s: self.tokens.wake())
        self.replica.listeners.append(lambda _e, _s: self.tokens.wake())
        # metrics and the record of every request (docs/operations.md)
        self.observer = self._observer()
        # the master role, driven by the cluster member while this node is master
        self.master: MasterRole | None = None
        self.hooks = MasterHooks(
            start=self._start_master,
            stop=self._stop_master,
            accept_local=self._master_accept,
            command=self._master_command,
            emit=self._master_emit,
        )
        # built in run(), on the open libp2p host
        self.net: Network | None = None
        self.member: ClusterMember | None = None
        self.pulls = None  # exo_p2p.models.pulls.PullManager once the host is up
        self._send_chunk = None  # the member's send_chunk, or its test-only faulty wrapper
        self._nursery: trio.Nursery | None = None
        self._master_scope: trio.CancelScope | None = None

    def _observer(self):  # type: ignore[no-untyped-def]
        """The node's ``exo_p2p.metrics.observer.Observer``: its metrics read State, its
        runners' figures, its counters and the model bytes it received; its request log
        writes ``requests.jsonl`` in the data dir unless ``--request-log-bytes 0``; either is None
        when off (``--no-metrics``, ``--no-request-records``)."""
        from exo_p2p.metrics.collect import MetricSources, NodeCounts, RunnerFigures, count_event
        from exo_p2p.metrics.observer import Observer
        from exo_p2p.metrics.registry import NodeMetrics
        from exo_p2p.metrics.request_log import FILE_NAME, RequestLog

        cfg = self.config
        path = self.data_dir / FILE_NAME if cfg.request_log_bytes > 0 else None
        requests = RequestLog(path, max(1, cfg.request_log_bytes)) if cfg.request_records else None
        if not cfg.metrics:
            return Observer(None, requests, keep_text=cfg.log_request_text)
        counts = NodeCounts(transfer_bytes=self.depot.bytes_received)
        self.replica.listeners.append(lambda indexed, _s: count_event(counts, indexed.event, self.node_id))
        sources = MetricSources(
            state=self.state, node_id=self.node_id, is_master=lambda: self.master is not None,
            runners=lambda: [RunnerFigures(*r) for r in self.worker.runner_figures()],
            counters=lambda: self.health().counters if self.member is not None and self.net is not None else {},
            counts=counts)
        metrics = NodeMetrics(known_model=lambda m: m in self.replica.state.model_cards, sources=sources)
        return Observer(metrics, requests, keep_text=cfg.log_request_text)

    # --- events -------------------------------------------------------------------------
    def emit_local(self, event: Event) -> None:
        """Queue a local event for the master (re-sent until seen indexed)."""
        self.member.send_local(event)

    # --- master role hooks (driven by the cluster member) ---------------------------------
    async def _start_master(self, term: int) -> None:
        from master.role import MasterRole

        self.master = MasterRole(
            self.node_id,  # type: ignore[arg-type]
            term,
            self.replica,
            self.member.publish_indexed,
            wait_committed=self.member.wait_committed,
            queue_limit=self.config.queue_limit,
            reachable=self.member.reachable_nodes,
            heard_ago=self.member.last_seen,
            rank_settings=self.config.engine.rank_settings(),
            restore_size=self.config.restore_size,
            relink=self.config.relink,
            routing=self.config.routing,
        )
        await self.master.emit([MasterElected(self.node_id, term)])  # type: ignore[arg-type]
        self._master_scope = trio.CancelScope()
        assert self._nursery is not None
        self._nursery.start_soon(self._run_master_duties, self.master, self._master_scope)

    async def _run_master_duties(self, master, scope: trio.CancelScope) -> None:  # type: ignore[no-untyped-def]
        with scope:
            await master.run()

    async def _stop_master(self) -> None:
        self.master = None
        if self._master_scope is not None:
            self._master_scope.cancel()

    async def _master_accept(self, local: LocalEvent) -> None:
        if self.master is not None:
            await self.master.accept_local(local)

    async def _master_command(self, command: Command) -> CommandResult:
        if self.master is None:
            return CommandResult(command.command_id, error=ErrorInfo(503, "not the master", "server_error", code="not_master"))
        return await self.master.command(command)

    async def _master_emit(self, events: list[Event]) -> int:
        return await self.master.emit(events) if self.master is not None else 0

    # --- chunks ------------------------------------------------------------------------------
    def _track_tasks(self, indexed: IndexedEvent, state: State) -> None:
        event = indexed.event
        if isinstance(event, TaskCreated):
            self._task_api_node[event.task.task_id] = event.task.api_node_id
            instance = state.instances.get(event.task.instance_id)  # type: ignore[call-overload]
            if instance is not None and instance.shards:
                self._task_rank0[event.task.task_id] = instance.shards[0].node_id
            for table in (self._task_api_node, self._task_rank0):
                if len(table) > 100_000:  # bounded: drop the oldest half
                    for key in list(table)[:50_000]:
                        del table[key]

    def route_chunk(self, chunk: Chunk) -> None:
        """Hand a runner's chunk to the API node that owns its request (here, or over a
        direct stream to that node; never through gossip)."""
        destination = self._task_api_node.get(chunk.task_id)
        if destination is None:
            record = self.replica.state.tasks.get(chunk.task_id)  # type: ignore[call-overload]
            destination = record.task.api_node_id if record is not None else self.node_id
        if destination == self.node_id:
            self.router.deliver(chunk)
        else:
            (self._send_chunk or self.member.send_chunk)(destination, chunk, self._chunk_numbering.number(chunk))

    def _receive_chunks(self, peer: str, chunks: list[Chunk], seqs: list[int]) -> None:
        """Chunks from ``peer``, ``seqs[i]`` the position of ``chunks[i]``: delivered (in
        position order, each once: ``exo_p2p.chunk_order``) only when ``peer`` hosts rank 0
        of the task's instance (no other node may write into a client's stream) and every
        chunk is numbered. A chunk of a task whose ``TaskCreated`` this node has not applied
        yet (its log lags rank 0's by a moment) is delivered: the router only delivers to
        requests this node opened."""
        numbered = len(seqs) == len(chunks) and all(s >= 1 for s in seqs)
        for i, chunk in enumerate(chunks):
            rank0 = self._task_rank0.get(chunk.task_id)
            if not numbered and (rank0 is None or rank0 == peer):
                self.router.undeliverable += 1
            elif rank0 is None or rank0 == peer:
                self.router.deliver(chunk, seqs[i])
            else:
                self.router.undeliverable += 1
                self.chunks_refused += 1

    # --- backend for the API ---------------------------------------------------------------
    def state(self) -> State:
        return self.replica.state

    def health(self) -> NodeHealth:
        warnings: list[str] = []
        alone = no_peers_warning(self.member.alone_for(), bool(self.member.peers.disconnected_at), NO_PEERS_WARNING_AFTER)
        if alone is not None:
            warnings.append(alone)
        if self.member.duplicate_identity:
            warnings.append(self.member.duplicate_identity)
        if self.member.master is None:
            warnings.append("no master elected yet")
        for addr, error in sorted(self.net.bootstrap_failures.items()):
            # the prefix is what `exo-p2p doctor` looks for
            warnings.append(f"bootstrap peer unreachable: {addr}: {error}")
        counters = dict(self.net.counters)
        counters.update(self.member.counters)
        counters["local_events_pending"] = self.member.local_events_pending
        if self.master is not None:
            counters.update(self.master.counters)
        counters["chunks_undeliverable"] = self.router.undeliverable
        counters["chunk_not_from_rank0"] = self.chunks_refused
        counters["chunks_duplicate"] = self.router.duplicates
        counters["chunk_stream_gaps"] = self.router.gaps
        counters["tasks_lost"] = self.router.lost
        counters["orphaned_tasks_cancelled"] = self.orphans.cancelled
        counters["loop_lag_worst_ms"] = int(self.loop_watch.worst_lag * 1000)  # exo_p2p.loop_watch
        counters["loop_lag_late_wakes"] = self.loop_watch.late
        if getattr(self, "prober", None) is not None:  # links measured (docs/links.md)
            counters.update(link_rounds=self.prober.rounds, link_events=self.prober.events,
                            link_probes_served=self.probes.served, link_probes_refused=self.probes.refused)
        return NodeHealth(node_id=self.node_id, master=self.replica.state.master, warnings=warnings, counters=counters)  # type: ignore[arg-type]

    def nodes(self) -> list[NodeSummary]:
        state = self.replica.state
        out = []
        for node_id, profile in sorted(state.nodes.items()):
            out.append(
                NodeSummary(
                    node_id=node_id,
                    friendly_name=profile.friendly_name,
                    is_self=node_id == self.node_id,
                    is_master=node_id == state.master,
                    memory_total=profile.memory_total,
                    memory_available=profile.memory_available,
                    addrs=[a.multiaddr for a in profile.addrs],
                    last_seen=round(self.member.last_seen(node_id) or 0.0, 1),
                    links=[
                        LinkSummary(sink, f.address, f.rtt_us, f.bytes_per_s, f.interface_type)
                        for sink, figures in sorted(state.links.get(node_id, {}).items())
                        for f in figures.values()
                    ],
                )
            )
        return out

    def local_models(self) -> list[ModelCard]:
        return list(self._local_cards)

    async def command(self, command: Command, timeout: float = 30.0) -> CommandResult:
        """Send ``command`` to the master; a placement of a model no node holds whose name is a
        hub repo id is read from the hub first (``_from_hub``)."""
        from exo_p2p.types import PlaceInstance

        if isinstance(command, PlaceInstance) and command.model_id not in self.replica.state.model_cards:
            command, failed = await self._from_hub(command)
            if failed is not None:
                return failed
        return await self.member.command(command, timeout)

    async def _from_hub(self, command):  # type: ignore[no-untyped-def]
        """``(command, None)`` with its model read from a hub and in State (``read_from_hub``),
        or ``(command, error result)`` naming why not; a name that is no repo id or a node
        that never asks a hub: the command unchanged (the master answers 404)."""
        model_id, error = await self.read_from_hub(str(command.model_id))
        command = msgspec.structs.replace(command, model_id=model_id)
        return command, (CommandResult(command.command_id, error=error) if error is not None else None)

    async def read_from_hub(self, name: str) -> tuple[str, ErrorInfo | None]:
        """``(model id, None)`` once model ``name`` (``ORG/NAME[@REV]``) is known to the
        cluster: read from a hub (its card and manifest, ``HubAccess.resolve``) and recorded
        in State (``HubModelResolved``, waited for at most 15 s) unless State has its card
        already; ``(name, None)`` unchanged for a name that is no repo id or a node that never
        asks a hub (still unknown); ``(repo id, error)`` when the hub cannot give it (gated,
        missing, unreachable, not MLX-format: ``hub_manifest.hub_error_status``)."""
        from exo_p2p.models.hub import is_repo_id, parse_repo
        from exo_p2p.models.hub_manifest import hub_error_status, hub_error_text
        from exo_p2p.types import HubModelResolved

        if not is_repo_id(name) or not self.hub.enabled:
            return name, None
        repo, _ = parse_repo(name)
        if repo in self.replica.state.model_cards:
            return repo, None
        try:
            source, card = await self.hub.resolve(name, self.depot)
        except Exception as exc:  # the hub's answer, as one line for the caller
            return repo, ErrorInfo(hub_error_status(exc), hub_error_text(exc), "invalid_request_error", "model")
        await self._publish_now()
        self.emit_local(HubModelResolved(self.node_id, card, source))  # type: ignore[arg-type]
        with trio.move_on_after(15):
            while repo not in self.replica.state.hub_models:
                await trio.sleep(0.05)
        return repo, None

    async def _publish_now(self) -> None:
        """Publish this node's profile now (its held models changed)."""
        profile = self.replica.state.nodes.get(self.node_id)  # type: ignore[call-overload]
        if profile is not None:
            self.emit_local(NodeProfileUpdated(msgspec.structs.replace(profile, held_models=self.depot.held())))

    def open_chunks(self, task_id: str) -> trio.MemoryReceiveChannel[Chunk]:
        return self.router.open(task_id)

    def close_chunks(self, task_id: str) -> None:
        self.router.close(task_id)

    def event_times(self, since: int):  # type: ignore[no-untyped-def]
        return self.member.event_times.since(since)

    def resolve_node(self, name: str) -> str:
        """The node id for ``name`` (a node id, a friendly name or a unique id prefix).

        Raises ``ValueError`` naming an unknown or ambiguous name (the API answers 400)."""
        from master.placement import PlacementError, resolve_nodes

        try:
            resolved = resolve_nodes(self.replica.state, [name])
        except PlacementError as exc:
            raise ValueError(str(exc)) from None
        if not resolved:
            raise ValueError("an empty node name")
        return resolved[0]

    def previews(self, model_id: str, nodes: tuple[str, ...]) -> list[dict]:
        from master.placement import placement_previews, resolve_nodes

        state = self.replica.state
        card = state.model_cards.get(model_id)  # type: ignore[call-overload]
        if card is None:
            raise KeyError(model_id)
        required = resolve_nodes(state, nodes) if nodes else None
        from master.placement_fetch import fetch_split

        out = []  # per node the bytes it would fetch, from peers and from a hub (placement_fetch)
        for p in placement_previews(state, card, nodes=required):
            split = fetch_split(state, card, p.sharding, p.nodes, p.fetch_bytes_per_node)
            hub = sum(h for _, h in split)
            out.append(
                {
                    "sharding": p.sharding,
                    "world_size": p.world_size,
                    "nodes": list(p.nodes),
                    "layers": list(p.layers_per_node),
                    "bytes": list(p.bytes_per_node),
                    "weights": list(p.weights_per_node),
                    "fetch_bytes": list(p.fetch_bytes_per_node),  # from peers first (docs/models.md)
                    "fetch_from_peers": [f for f, _ in split],
                    "fetch_from_hub": [h for _, h in split],
                    "fetch_from": "peers, then the hub" if hub else "peers",
                    "network_us_per_token": p.network_us_per_token,  # estimated (docs/links.md)
                    "links_measured": p.links_measured,
                    "error": p.error,
                    "instance": msgspec.to_builtins(p.instance) if p.instance is not None else None,
                }
            )
        return out

    def _runner_environment(self) -> dict[str, str]:
        """The environment of this node's runners (``worker.blas``), logged once at start:
        which BLAS they use and how many threads, or one warning naming the install command."""
        from worker import blas

        choice = blas.choose()
        if choice.library is not None:
            log.info("runners use an optimised BLAS", library=str(choice.library), threads=choice.threads,
                     cpu_weights=self.config.cpu_weights)
        elif choice.warning is not None:
            log.warning(choice.warning)
        else:
            log.info("runners use MLX's own BLAS", cpu_weights=self.config.cpu_weights)
        return blas.runner_environment(os.environ, choice.library, choice.threads)

    # --- loops ----------------------------------------------------------------------------
    async def _profile_loop(self) -> None:
        """Measure and publish this node's profile every 2 s; a transient OS error (out of
        descriptors reading ``/proc``) costs a round, not the node (``exo_p2p.listeners``);
        each round also keeps the open-file limit (``exo_p2p.limits.check_nofile``)."""
        from exo_p2p.limits import check_nofile
        from exo_p2p.listeners import Backoff

        pause = Backoff("profile")
        last: tuple = (None, None)
        while True:
            try:
                last = self._profile_round(*last)
                check_nofile("profile")
            except OSError as exc:
                await pause.ride_out(exc)
                continue
            pause.reset()
            await trio.sleep(2.0)

    def _profile_round(self, last, last_hosted):  # type: ignore[no-untyped-def]
        """One round of ``_profile_loop``: returns the (profile, hosted bytes) last published."""
        from worker.profile import measure_profile, publish_due

        hosted = self.worker.hosted_bytes()
        addrs = tuple(_address_of(a) for a in self.net.listen_addrs())
        profile = measure_profile(
            self.node_id,
            self.boot_id,
            self.config.friendly_name or _default_name(),
            memory_limit=self.config.memory_limit,
            hosted_bytes=hosted,
            addrs=addrs,
            models=tuple(sorted(c.model_id for c in self._local_cards)),
            priority=self.config.priority,
            cpu_weights=self.config.cpu_weights,
        )
        profile = _with_fault_hooks(profile, self.config.fault_hooks)
        profile = msgspec.structs.replace(  # models travel between nodes (docs/models.md)
            profile, held_models=self.depot.held(), models_disk_free=self.depot.disk_free() >> 30 << 30)
        # (free disk rounded down to whole GiB: other writers on the disk must not churn it)
        published = self.replica.state.nodes.get(self.node_id)  # type: ignore[call-overload]
        # also re-publish when State's copy differs from what we published (we were timed
        # out, our log was replaced by another master's) once nothing of ours is in flight
        stale = last is not None and published != last and self.member.master is not None and self.member.outbox.idle
        if publish_due(last, profile, last_hosted, hosted) or stale:
            log.debug("profile published", boot_id=self.boot_id)
            self.emit_local(NodeProfileUpdated(profile))
            last, last_hosted = profile, hosted
        if published is not None and published.models != profile.models and self.member.outbox.idle:
            self.emit_local(NodeModelsUpdated(self.node_id, tuple(self._local_cards)))  # type: ignore[arg-type]
        return last, last_hosted

    async def _wait_joined(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until a master is known and this node's profile and
        models are in State, so the API never answers from a node that is still joining."""
        with trio.move_on_after(timeout) as scope:
            while True:
                state = self.replica.state
                profile = state.nodes.get(self.node_id)  # type: ignore[call-overload]
                # our profile *of this boot*: a restarted node's log still holds the old one
                joined = profile is not None and profile.boot_id == self.boot_id
                if self.member.master is not None and joined and all(c.model_id in state.model_cards for c in self._local_cards):
                    return
                await trio.sleep(0.05)
        if scope.cancelled_caught:
            log.warning("not joined yet; serving the API anyway", master=self.member.master)

    async def count_tokens(self, model_id: str, params) -> int:  # type: ignore[no-untyped-def]
        """``ApiBackend.count_tokens``: the prompt of ``params`` tokenized with the tokenizer of
        this node's copy of ``model_id`` (kept, and loaded at placement: ``exo_p2p.models.token_count``).
        Raises ``KeyError`` when the model is not stored here, ``ValueError`` when its chat
        template fails."""
        return await self.tokens.count(model_id, params)

    async def _fetch_shard(self, instance, shard, on_progress) -> Path:  # type: ignore[no-untyped-def]
        """The worker's ``FetchShard``: this rank's chunks from the peers holding the model
        (``exo_p2p.models.shard_fetch``)."""
        from exo_p2p.models.shard_fetch import fetch_shard

        return await fetch_shard(self.depot, self.net, self.node_id, self.state, instance, shard,
                                 on_progress=on_progress, hub=self.hub)

    async def models_changed(self) -> None:
        """Re-list this node's models after a pull or a removal."""
        await self._load_models()

    async def _load_models(self) -> None:
        self._local_cards = await trio.to_thread.run_sync(self.store.list_cards)
        self.emit_local(NodeModelsUpdated(self.node_id, tuple(self._local_cards)))  # type: ignore[arg-type]

    async def _watch_models(self) -> None:
        """Re-list this node's models every ``REFRESH_SECONDS`` (as the depot re-scans) and
        publish them when they changed: a model downloaded into Ollama, LM Studio or a models
        dir while the node runs is listed (docs/models.md#model-stores). Cheap when nothing
        changed: cards are cached by their files' paths, sizes and mtimes."""
        from exo_p2p.models.depot import REFRESH_SECONDS

        while True:
            await trio.sleep(REFRESH_SECONDS)
            try:
                cards = await trio.to_thread.run_sync(self.store.list_cards)
            except Exception as exc:  # a scan failure must not stop the node
                log.warning("model re-listing failed", error=repr(exc))
                continue
            if cards != self._local_cards:
                self._local_cards = cards
                self.emit_local(NodeModelsUpdated(self.node_id, tuple(cards)))  # type: ignore[arg-type]

    # --- main -----------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        from exo_p2p.api.access import AccessPolicy, is_loopback_host
        from exo_p2p.api.hosts import bind_names
        from exo_p2p.api.app import create_app
        from exo_p2p.api.server import serve
        from exo_p2p.cluster.member import ClusterMember, ClusterSettings
        from exo_p2p.logging import announce
        from exo_p2p.net import NetConfig, open_host

        cfg = self.config
        secret = cfg.cluster_secret_file.read_bytes().strip() if cfg.cluster_secret_file else None
        net_config = NetConfig(
            identity=self.identity,
            listen_host=cfg.listen_host,
            listen_port=cfg.listen_port,
            cluster=cfg.cluster,
            cluster_secret=secret,
            bootstrap=tuple(cfg.bootstrap),
            mdns=cfg.mdns,
        )
        async with open_host(net_config) as net:
            self.net = net
            self.member = ClusterMember(
                net,
                self.replica,
                self.node_id,
                self.boot_id,
                self.hooks,
                priority=cfg.priority,
                settings=ClusterSettings(fault_hooks=dict(cfg.fault_hooks)),  # gossip faults: tests only
                on_chunks=self._receive_chunks,
            )
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self.loop_watch.run)  # how late the loop runs, and why (exo_p2p.loop_watch)
                self.router.bind(nursery)
                nursery.start_soon(self.router.watch, lambda: self.replica.state)  # lost tasks end (exo_p2p.chunk_router)
                nursery.start_soon(self.orphans.run)  # tasks whose request is gone here are cancelled (exo_p2p.orphans)
                self._install_chunk_faults(nursery)
                await nursery.start(self._run_member, nursery.cancel_scope)
                log.debug("start-up", step="member running")
                await self._load_models()
                log.debug("start-up", step="models listed")
                await nursery.start(self.depot.run, net)  # models travel: docs/models.md
                log.debug("start-up", step="depot running")
                await self._start_links(net, nursery)  # links measured: docs/links.md
                from exo_p2p.models.pulls import PullManager

                self.pulls = PullManager(self.depot, net, self.node_id, lambda: self.replica.state,
                                         nursery, self.models_changed, hub=self.hub,
                                         models_dir=Path(self.config.models_dirs[0]) if self.config.models_dirs else None)
                nursery.start_soon(self._profile_loop)
                nursery.start_soon(self._watch_models)  # models added to a store while running
                nursery.start_soon(self.worker.run)
                nursery.start_soon(self.tokens.run, lambda: settled(self.state(), self.node_id), self.node_id, self.boot_id)  # exo_p2p.preload_gate
                await self._wait_joined(15.0)
                log.debug("start-up", step="joined")
                access = AccessPolicy.of(cfg.api_keys, cfg.cors_origins, [*cfg.allowed_hosts, *bind_names(cfg.api_host)],
                                         metrics_loopback_open=cfg.metrics_loopback_open)
                if not access.api_keys and not is_loopback_host(cfg.api_host):
                    warning = (
                        f"the API listens on {cfg.api_host} without an API key: anyone who reaches "
                        f"port {cfg.api_port} can use it; start with --api-key KEY to require one"
                    )
                    log.warning("api open to the network", api_host=cfg.api_host)
                    print(f"warning: {warning}", file=sys.stderr)
                app = create_app(self, queue_limit=cfg.queue_limit, access=access,
                                 generation=GenerationSettings(max_moves=cfg.max_moves), observer=self.observer)
                self.api_port = await nursery.start(serve, app, cfg.api_host, cfg.api_port)
                log.info(
                    "node ready",
                    node_id=self.node_id,
                    api=f"http://{cfg.api_host}:{self.api_port}",
                    addrs=net.listen_addrs(),
                    data_dir=str(self.data_dir),
                )
                facts = self._start_facts(secret is None)
                announce(banner(self.node_id, f"http://{cfg.api_host}:{self.api_port}", net.listen_addrs(), facts), facts)
                gc.freeze()  # what start-up built stays: a full collection under a flood of connections scans only theirs
                self.started.set()
                task_status.started()
                await trio.sleep_forever()

    async def _start_links(self, net, nursery: trio.Nursery) -> None:  # type: ignore[no-untyped-def]
        """Serve probes of this node's addresses and measure every address of every peer
        (``exo_p2p.links``: the probe listener on the addresses libp2p listens on)."""
        from exo_p2p.links.probe_server import ProbeServer
        from exo_p2p.links.prober import Prober
        from exo_p2p.models.bulk import listen_hosts

        self.probes = ProbeServer()
        self.probes.register(net, lambda: self.replica.state.nodes)
        await nursery.start(self.probes.run, listen_hosts(net.listen_addrs()))
        self.prober = Prober(net, self.node_id, lambda: self.replica.state, self.emit_local)
        nursery.start_soon(self.prober.run)

    def _start_facts(self, open_cluster: bool) -> list:  # list[exo_p2p.announce.Fact]
        """What the node says once it is ready: its cluster (joined or new), the instances from
        before its restart that are being re-placed, and whether the cluster is open."""
        from exo_p2p.net.config import OPEN_CLUSTER_NOTICE

        state = self.replica.state
        facts = [membership_fact(self.config.cluster, self.node_id, self.member.master, self.member.reachable_nodes(), state)]
        if (before := from_before_fact(state, still_coming(state, self._from_before))) is not None:
            facts.append(before)
        return [*facts, secret_fact(OPEN_CLUSTER_NOTICE if open_cluster else None)]

    def _install_chunk_faults(self, nursery: trio.Nursery) -> None:
        """Tests only: with ``chunk_*`` fault hooks, the chunks this node sends to other
        nodes are dropped, duplicated and reordered (``cluster.faults.FaultyChunkSender``)."""
        from exo_p2p.cluster.faults import FaultyChunkSender, chunk_faults_from_hooks

        faults = chunk_faults_from_hooks(self.config.fault_hooks)
        if faults is None:
            return
        log.warning("chunk fault injection on (tests only)", drop=faults.drop, dup=faults.dup, reorder=faults.reorder)

        def count(kind: str, n: int) -> None:
            key = f"fault_{kind}:chunks"
            self.member.counters[key] = self.member.counters.get(key, 0) + n

        sender = FaultyChunkSender(self.member.send_chunk, faults, on_count=count)  # type: ignore[arg-type]
        self._send_chunk = sender
        nursery.start_soon(sender.run)

    async def _run_member(self, node_scope: trio.CancelScope, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await self.member.run(task_status=task_status)
        if self.member.duplicate_identity:
            self.exit_reason = self.member.duplicate_identity
            node_scope.cancel()

    def close(self) -> None:
        self.replica.close()


def _with_fault_hooks(profile: NodeProfile, hooks: dict[str, str]) -> NodeProfile:
    """Tests only: ``free_memory=BYTES`` caps the memory this node reports available (its
    total is kept, so placement on a node without instances still sees the whole node)."""
    cap = hooks.get("free_memory", "")
    if not cap.isdigit() or profile.memory_available is None:
        return profile
    return msgspec.structs.replace(profile, memory_available=min(profile.memory_available, int(cap)))


def _default_name() -> str:
    import socket

    return socket.gethostname()


def stop_signals() -> tuple[int, ...]:
    """The signals a node stops on, as on SIGTERM (runners shut down, the log closed):
    SIGINT, SIGTERM, and SIGHUP (the terminal it runs in was closed) unless SIGHUP is ignored
    (``nohup``: the user asked the node to outlive its terminal)."""
    hup = () if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else (signal.SIGHUP,)
    return (signal.SIGINT, signal.SIGTERM, *hup)


async def _run_until_signal(node: Node) -> None:
    with trio.open_signal_receiver(*stop_signals()) as signals:
        async with trio.open_nursery() as nursery:

            async def run_then_stop() -> None:
                await node.run()  # returns when the node gives up (e.g. a duplicate identity)
                nursery.cancel_scope.cancel()

            nursery.start_soon(run_then_stop)

            async def stop_on_signal() -> None:
                async for signum in signals:
                    log.info("stopping", signal=signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(stop_on_signal)


class StartupError(Exception):
    """The node cannot start (port in use, data dir used by another node); one-line message."""


def check_can_start(config: NodeConfig):  # type: ignore[no-untyped-def]
    """Fail fast, before joining anything, when the node could not run: the API or libp2p
    port is taken, or another node process uses the same data dir (two nodes on one data
    dir would share an identity and an event log). Returns the data-dir lock (an open file
    holding an exclusive ``flock``), to keep for the process lifetime. Raises StartupError."""
    import fcntl
    import socket

    for what, host, port, flag in (
        ("API", config.api_host, config.api_port, "--api-port"),
        ("libp2p", config.listen_host, config.listen_port, "--listen-port"),
    ):
        if port == 0:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # as the servers bind (hypercorn, trio): connections of a node that just died,
            # left in TIME_WAIT, must not block its restart; a live listener still does
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as exc:
                raise StartupError(f"{what} port {port} on {host} is not available ({exc.strerror}); is another exo-p2p node running? choose another with {flag}") from None
    data_dir = Path(config.data_dir)
    try:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = open(data_dir / "node.lock", "a+")
    except OSError as exc:
        raise StartupError(f"cannot use the data dir {data_dir}: {exc.strerror or exc}; choose another with --data-dir") from None
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        other = lock.read().strip() or "?"
        lock.close()
        raise StartupError(f"another exo-p2p node (pid {other}) is using the data dir {data_dir}; stop it or use --data-dir") from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


def first_leaf(exc: BaseException) -> BaseException:
    """The first exception that is no group, looking into nested exception groups (trio
    nests one group per nursery level; a group's own message only counts its members)."""
    while isinstance(exc, BaseExceptionGroup):  # noqa: F821 - Python 3.11 builtin
        exc = exc.exceptions[0]
    return exc


def run_node(config: NodeConfig) -> int:
    """Run a node until SIGINT/SIGTERM; runners are shut down on the way out. Returns the
    process exit code (0 on a clean stop, 1 when the node could not start)."""
    from exo_p2p.limits import guard_setrlimit, keep_nofile
    from exo_p2p.logging import configure_logging, report_error

    guard_setrlimit()  # first: no import may lower the open-file limit (exo_p2p.limits)
    try:
        configure_logging(config.log_format, config.log_level, node_name=config.friendly_name or _default_name(), log_file=config.log_file)
    except OSError as exc:
        print(f"error: cannot write the log file {config.log_file}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    if config.log_file is not None:
        from exo_p2p import log_rotation

        log_rotation.watch(Path(config.log_file))  # bounded on disk (exo_p2p.log_rotation)
    try:
        lock = check_can_start(config)
    except StartupError as exc:
        report_error(str(exc))
        return 1
    keep_nofile("node")
    try:
        node = Node(config)
    except OSError as exc:
        report_error(str(exc))
        lock.close()
        return 1
    try:
        trio.run(_run_until_signal, node)
    except OSError as exc:
        report_error(str(exc))
        return 1
    except BaseExceptionGroup as group:  # noqa: F821 - Python 3.11 builtin
        oserrors, rest = group.split(OSError)
        if rest is None and oserrors is not None:
            report_error(str(first_leaf(oserrors)))
            return 1
        raise
    finally:
        node.close()
        lock.close()
    if node.exit_reason:
        report_error(node.exit_reason)
        return 1
    return 0
