"""The composition root: one ``exo-p2p node`` process (docs/architecture.md#layers).

Builds the node's parts and wires them in one trio process: the libp2p host, the cluster
membership (heartbeats, election, log replication), the replica of the event log, the
worker, the master role while this node is master and the HTTP API. Every part is handed
what it uses (no part holds the node). The composition modules, the only ones that import
``master`` or ``worker``: this one (builds, then runs the parts in order), ``seat`` (the
master role's seat), ``placement`` (the API's placement questions) and ``worker_env``
(runner environment, profile measure). What needs neither role lives in modules of its own:
``backend`` (the API's backend), ``parts`` (the record of the running parts),
``exo_p2p.chunks``, ``profile_publisher``, ``status`` and ``process`` (the OS process:
start-up checks, signals, exit code).

Every import is at module level: only the ``node`` command imports this module, after it
guarded the open-file limit (``exo_p2p.limits``), and a node needs all of them at start."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

import structlog
import trio

from exo_p2p.api.start import start_api
from exo_p2p.chunks.router import ChunkRouter
from exo_p2p.chunks.routes import ChunkRoutes
from exo_p2p.cluster.member import ClusterMember, ClusterSettings
from exo_p2p.config import NodeConfig
from exo_p2p.models.hub.announce import HubModels
from exo_p2p.links.probe_server import ProbeServer
from exo_p2p.links.prober import Prober
from exo_p2p.models.stores.announce import LocalModels
from exo_p2p.logs.configure import announce
from exo_p2p.metrics.collect import MetricSources, NodeCounts, RunnerFigures
from exo_p2p.metrics.node_observer import node_observer
from exo_p2p.metrics.observer import Observer
from exo_p2p.models.transfer.bulk import listen_hosts
from exo_p2p.models.depot.depot import ModelDepot
from exo_p2p.models.copies.cleanup import reclaim_at_start
from exo_p2p.models.hub.fetch import HubAccess
from exo_p2p.models.depot.pulls import PullManager
from exo_p2p.models.depot.shard_fetch import fetch_shard
from exo_p2p.models.stores.store import ModelStore, store_roots
from exo_p2p.models.token_count import TokenCounter
from exo_p2p.net import NetConfig, Network, load_or_create_identity, new_boot_id, open_host
from exo_p2p.net.config import OPEN_CLUSTER_NOTICE
from exo_p2p.vision import peer as vision_peer
from exo_p2p.node.announce import banner, from_before_fact, instances_from_before, membership_fact, secret_fact, still_coming
from exo_p2p.node.backend import BackendParts, NodeBackend
from exo_p2p.node.loop_watch import LoopWatch
from exo_p2p.node.orphans import OrphanSweeper
from exo_p2p.node.parts import Running, own_counters
from exo_p2p.node.placement import previews, resolve_node
from exo_p2p.node.preload_gate import settled
from exo_p2p.node.process import run_process
from exo_p2p.node.profile_publisher import ProfilePublisher
from exo_p2p.node.seat import MasterSeat
from exo_p2p.node.status import joined
from exo_p2p.node.worker_env import node_idle, profile_measure, runner_environment
from exo_p2p.replica import Replica
from exo_p2p.types import Event, Instance, ShardMetadata, State
from worker.calibrate.run import Calibration
from worker.profile import publish_due
from worker.worker import Worker

log = structlog.get_logger(__name__)


class Node:
    """One node process. ``await Node(config).run()`` serves until cancelled or signalled."""

    def __init__(self, config: NodeConfig) -> None:
        """Build every part that needs no network: identity, replica, model store, worker and
        the master's seat. ``run`` opens the libp2p host and builds the parts that live on it
        (``running``). Raises ``OSError`` when the data dir cannot be read."""
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.router = ChunkRouter()
        self.started = trio.Event()
        self.exit_reason: str | None = None
        """Why the node gave up (a duplicate identity), or None."""
        self.api_port: int | None = None
        self.identity = load_or_create_identity(self.data_dir, new=config.new_identity)
        self.node_id: str = self.identity.node_id
        self.boot_id: str = new_boot_id()
        self.replica = Replica(self.data_dir / "events.log", compact_every=config.compact_every)
        self._from_before = instances_from_before(self.replica.state, self.node_id, self.boot_id)  # said at start
        self.routes = ChunkRoutes(self.node_id, self.state, self.router)
        self.loop_watch = LoopWatch()  # loop lag and slow task steps: GET /state counters, the log
        self._build_models()
        runner_env = runner_environment(config.cpu_weights)
        self.calibration = Calibration(runner_env)  # this node's speed: worker.calibrate, docs/placement-speed.md
        self.worker = Worker(self.node_id, self.boot_id, self.state, self.emit_local, self.routes.route,
                             lambda model_id: self.store.resolve(model_id), engine=config.engine.in_data_dir(self.data_dir),
                             fault_hooks=config.fault_hooks, runner_env=runner_env,
                             fetch_shard=self._fetch_shard,  # a shard of a model this node lacks (docs/models.md)
                             image_bytes=self._image_bytes,  # a task's images, from the API node (exo_p2p.vision.peer)
                             stalled=self.loop_watch.stalls.between)  # its own stalls are not a runner's silence
        self.tokens = TokenCounter(self.store.resolve)  # tokenizers, loaded while an instance placed here loads
        self.replica.listeners += [self.routes.on_event, self.router.on_event,  # worker and tokens fed by the replica
                                   lambda _e, _s: self.worker.wake(), lambda _e, _s: self.tokens.wake()]
        self.replica.snapshot_listeners += [lambda _s: self.worker.wake(), lambda _s: self.tokens.wake()]
        self.seat = MasterSeat(self.node_id, self.replica, config)  # the master role, while this node is master
        self.observer = self._observer()  # metrics and the record of every request (docs/operations.md)
        self._running: Running | None = None  # made once by run(), every part on the open host at once

    def _build_models(self) -> None:
        """The model store (models dirs, models pulled from peers, Ollama and LM Studio:
        docs/models.md#model-stores), its depot (models travel between nodes), the hub
        (docs/models.md#models-from-a-hub) and the node's models as the cluster hears them."""
        cfg = self.config
        self.store = ModelStore(self.data_dir, [Path(p) for p in cfg.models_dirs] + [self.data_dir / "models" / "pulled"],
                                **store_roots(cfg))
        self.depot = ModelDepot(self.store, self.data_dir, fault_hooks=cfg.fault_hooks)
        reclaim_at_start(self.depot, {i.model_id for i in self.replica.state.instances.values()})  # copies/cleanup
        self.hub = HubAccess(offline=cfg.offline, node_id=self.node_id)
        self.models = LocalModels(self.store, self.node_id, self.emit_local)
        self.hub_models = HubModels(self.hub, self.depot, self.node_id, self.state, self.emit_local)

    def _observer(self) -> Observer:
        """The node's ``Observer``: metrics and the record of every request (docs/operations.md,
        ``exo_p2p.metrics.node_observer``)."""

        def sources(counts: NodeCounts) -> MetricSources:
            return MetricSources(
                state=self.state, node_id=self.node_id, is_master=lambda: self.seat.role is not None,
                runners=lambda: [RunnerFigures(*r) for r in self.worker.runner_figures()],
                counters=self._api_counters, counts=counts)

        return node_observer(self.config, self.data_dir, self.replica, self.node_id, sources, self.depot.bytes_received)

    def _api_counters(self) -> dict[str, int]:
        """``GET /state``'s counters while running, none before."""
        running = self._running
        return running.api.health().counters if running is not None else {}

    @property
    def running(self) -> Running:
        """The parts on the open libp2p host. Raises ``RuntimeError`` before ``run`` made them."""
        if self._running is None:
            raise RuntimeError("the node is not running: its host, member and API are made by Node.run")
        return self._running

    def emit_local(self, event: Event) -> None:
        """Queue a local event for the master (re-sent until seen indexed)."""
        self.running.member.send_local(event)

    def state(self) -> State:
        """This node's replicated State."""
        return self.replica.state

    async def _fetch_shard(self, instance: Instance, shard: ShardMetadata,
                           on_progress: Callable[[int, int, int, int], None]) -> Path:
        """The worker's ``FetchShard``: this rank's chunks from the peers holding the model
        (``exo_p2p.models.depot.shard_fetch``)."""
        return await fetch_shard(self.depot, self.running.net, self.node_id, self.state, instance, shard,
                                 on_progress=on_progress, hub=self.hub)

    # --- running ---------------------------------------------------------------------------
    async def _image_bytes(self, api_node_id: str, digest: str) -> bytes | None:
        """An image's bytes for a runner here: this node's store, else the API node's."""
        return await vision_peer.image_bytes(self.running.net, self.node_id, api_node_id, digest)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open the libp2p host, build the cluster member on it, start member, worker,
        profile publishing and API in that order, then serve until cancelled (or until the
        member gives up: ``exit_reason``). Raises ``OSError`` when a port cannot be bound."""
        cfg = self.config
        secret = cfg.cluster_secret_file.read_bytes().strip() if cfg.cluster_secret_file else None
        async with open_host(self._net_config(secret)) as net:
            async with trio.open_nursery() as nursery:
                running = self._running = self._build_running(net, nursery)
                await self._start_parts(running, nursery)
                await self._wait_joined(running.member, 15.0)
                log.debug("start-up", step="joined")
                self.api_port = await start_api(nursery, running.api, cfg, self.observer)
                log.info("node ready", node_id=self.node_id, api=f"http://{cfg.api_host}:{self.api_port}",
                         addrs=net.listen_addrs(), data_dir=str(self.data_dir))
                self._announce(running, OPEN_CLUSTER_NOTICE if secret is None else None)
                gc.freeze()  # what start-up built stays: a full collection under a flood of connections scans only theirs
                self.started.set()
                task_status.started()
                await trio.sleep_forever()

    def _net_config(self, secret: bytes | None) -> NetConfig:
        """The libp2p host's ``NetConfig`` from this node's settings and identity."""
        cfg = self.config
        return NetConfig(identity=self.identity, listen_host=cfg.listen_host, listen_port=cfg.listen_port,
                         cluster=cfg.cluster, cluster_secret=secret, bootstrap=tuple(cfg.bootstrap), mdns=cfg.mdns)

    def _cluster_member(self, net: Network) -> ClusterMember:
        """This node's ``ClusterMember`` on the open host, driving the master's seat."""
        return ClusterMember(net, self.replica, self.node_id, self.boot_id, self.seat.hooks, priority=self.config.priority,
                             settings=ClusterSettings(fault_hooks=dict(self.config.fault_hooks),  # gossip faults: tests only
                                                      stalled=self.loop_watch.stalls.between,  # own lag is not a peer's silence
                                                      longest_stall=self.loop_watch.stalls.longest_since),  # told to peers
                             on_chunks=self.routes.receive)

    def _build_running(self, net: Network, nursery: trio.Nursery) -> Running:
        """The parts on the open host, made at once before any starts: the cluster member,
        pulls, the links' probe server and prober (docs/links.md), the orphan sweeper and the
        API's backend, handed the parts it reads."""
        cfg = self.config
        member = self._cluster_member(net)
        pulls = PullManager(self.depot, net, self.node_id, self.state, nursery, self.models.load, hub=self.hub,
                            models_dir=Path(cfg.models_dirs[0]) if cfg.models_dirs else None)
        probes, prober = ProbeServer(), Prober(net, self.node_id, self.state, self.emit_local)
        orphans = OrphanSweeper(self.node_id, self.state, self.router.open_task_ids, member.command)  # CancelGeneration only: no hub read
        parts = BackendParts(node_id=self.node_id, replica=self.replica, member=member, net=net, router=self.router,
                             models=self.models, hub_models=self.hub_models, tokens=self.tokens, depot=self.depot,
                             pulls=pulls, mdns=cfg.mdns)
        counters = (lambda: self.seat.counters,
                    lambda: own_counters(self.router, self.routes, orphans, self.loop_watch, probes, prober))
        api = NodeBackend(parts, counters, previews, resolve_node)  # what the API asks of this node
        return Running(net=net, member=member, pulls=pulls, probes=probes, prober=prober, api=api, orphans=orphans)

    async def _start_parts(self, running: Running, nursery: trio.Nursery) -> None:
        """Start every part in ``nursery``, in order: the loop's watch, the chunk router and
        the orphan sweeper, the member (until it is running), the node's models (listed),
        the depot, the links, profile publishing, the models' watch, the worker and the token
        counter."""
        member, net = running.member, running.net
        self.seat.bind(member, nursery)
        nursery.start_soon(self.loop_watch.run)  # how late the loop runs, and why (exo_p2p.node.loop_watch)
        self.router.bind(nursery)
        nursery.start_soon(self.router.watch, self.state)  # lost tasks end (exo_p2p.chunks.router)
        nursery.start_soon(running.orphans.run)  # tasks whose request is gone here are cancelled (exo_p2p.node.orphans)
        self.routes.bind(member.send_chunk, member.counters, self.config.fault_hooks, nursery)
        await nursery.start(self._run_member, member, nursery.cancel_scope)
        log.debug("start-up", step="member running")
        await self.models.load()
        log.debug("start-up", step="models listed")
        await nursery.start(self.depot.run, net)  # models travel: docs/models.md
        vision_peer.register(net)  # images' bytes to the node of the runner that reads them
        log.debug("start-up", step="depot running")
        await self._start_links(running, nursery)  # links measured: docs/links.md
        nursery.start_soon(self._profile_publisher(running).run)
        if self.config.calibrate:
            nursery.start_soon(self.calibration.run, lambda: node_idle(self.state(), self.node_id))
        nursery.start_soon(self.models.watch)  # models added to a store while running
        nursery.start_soon(self.worker.run)
        nursery.start_soon(self.tokens.run, lambda: settled(self.state(), self.node_id), self.node_id, self.boot_id)  # exo_p2p.node.preload_gate

    async def _run_member(self, member: ClusterMember, node_scope: trio.CancelScope, *,
                          task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await member.run(task_status=task_status)
        if member.duplicate_identity:
            self.exit_reason = member.duplicate_identity
            node_scope.cancel()

    async def _start_links(self, running: Running, nursery: trio.Nursery) -> None:
        """Serve probes of this node's addresses and measure every address of every peer
        (``exo_p2p.links``: the probe listener on the addresses libp2p listens on)."""
        running.probes.register(running.net, lambda: self.replica.state.nodes)
        await nursery.start(running.probes.run, listen_hosts(running.net.listen_addrs()))
        nursery.start_soon(running.prober.run)

    def _profile_publisher(self, running: Running) -> ProfilePublisher:
        """This node's ``ProfilePublisher``, measuring with ``worker.profile``."""
        return ProfilePublisher(self.node_id, self.boot_id,
                                profile_measure(self.node_id, self.boot_id, self.config, lambda: self.calibration.speed),
                                publish_due, hosted_bytes=self.worker.hosted_bytes, listen_addrs=running.net.listen_addrs,
                                cards=lambda: self.models.cards, depot=self.depot, member=running.member, state=self.state,
                                emit=self.emit_local, fault_hooks=self.config.fault_hooks)

    async def _wait_joined(self, member: ClusterMember, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until a master is known and this node's profile and
        models are in State, so the API never answers from a node that is still joining."""
        with trio.move_on_after(timeout) as scope:
            while not joined(self.replica.state, self.node_id, self.boot_id, member.master, self.models.cards):
                await trio.sleep(0.05)
        if scope.cancelled_caught:
            log.warning("not joined yet; serving the API anyway", master=member.master)

    def _announce(self, running: Running, secret_notice: str | None) -> None:
        """Say once that the node is ready: its API and addresses, its cluster (joined or
        new), the instances from before its restart being re-placed, and ``secret_notice``
        when the cluster is open (``exo_p2p.node.announce``)."""
        state, cfg, member, net = self.replica.state, self.config, running.member, running.net
        facts = [membership_fact(cfg.cluster, self.node_id, member.master, member.reachable_nodes(), state)]
        if (before := from_before_fact(state, still_coming(state, self._from_before))) is not None:
            facts.append(before)
        facts.append(secret_fact(secret_notice))
        announce(banner(self.node_id, f"http://{cfg.api_host}:{self.api_port}", net.listen_addrs(), facts), facts)

    def close(self) -> None:
        """Close the event log."""
        self.replica.close()


def run_node(config: NodeConfig) -> int:
    """Run a node until SIGINT/SIGTERM; runners are shut down on the way out. Returns the
    process exit code (0 on a clean stop, 1 when the node could not start:
    ``exo_p2p.node.process.run_process``)."""
    return run_process(config, Node)
