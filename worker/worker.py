"""The worker: runs ``plan`` in a loop and executes the tasks it returns (docs/architecture.md#request-flow)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog
import trio

from exo_p2p.types import (TERMINAL_STATUSES, CancelTask, Chunk, ConnectToGroup, CreateRunner, Event, Instance,
                           LoadModel, RunnerDownloading, RunnerFailed, RunnerShutdown, RunnerStatusUpdated,
                           ShardMetadata, Shutdown, StartWarmup, State)
from exo_p2p.types.observe import EngineStats
from exo_p2p.models.errors import ModelNotFoundError
from exo_p2p.types.engine import EngineSettings
from worker.liveness import LivenessBounds
from worker.plan import ForwardTask, LocalRunner, PlannedTask, plan
from worker.supervisor import RunnerSupervisor
from worker.vision.delivery import ImageBytes, forward_work

log = structlog.get_logger(__name__)

FetchShard = Callable[[Instance, ShardMetadata, Callable[[int, int, int, int], None]], Awaitable[Path]]
"""``fetch_shard(instance, shard, on_progress) -> model dir``: fetch this rank's shard of a
model the node lacks from its peers (``exo_p2p.models.depot.shard_fetch``); raises with the reason.
``on_progress(done, total, from_peers, from_hub)``: bytes (``exo_p2p.models.transfer.fetch.Progress``)."""
DOWNLOAD_STATUS_INTERVAL = 0.5
"""Seconds between two Downloading status events of one runner at most (the last one always)."""


class Worker:
    """Executes this node's share of the replicated plan.

    ``get_state()`` returns the current State; ``emit(event)`` sends a local event towards
    the master; ``on_chunk(chunk)`` routes a runner's chunk to the API node that owns the
    request; ``resolve_model(model_id) -> Path`` (blocking; run in a thread) gives the
    model's MLX directory, raising for a model this node does not have. ``fetch_shard``
    (optional, ``FetchShard``): when ``resolve_model`` raises ``ModelNotFoundError`` for a
    shard, the runner is ``Downloading`` while it fetches the shard from peers, and is then
    created on the fetched files (no process exists meanwhile; a deletion cancels the fetch).
    ``engine``: this node's engine settings (``NodeConfig.engine``); each runner gets them
    with its instance's rank settings and the resolved KV budget (``EngineSettings.for_runner``).
    ``image_bytes`` (``worker.vision.delivery.ImageBytes``): a task's images. Call ``wake()`` after every State change.
    """

    def __init__(
        self,
        node_id: str,
        boot_id: str,
        get_state: Callable[[], State],
        emit: Callable[[Event], None],
        on_chunk: Callable[[Chunk], None],
        resolve_model: Callable[[str], Path],
        *,
        engine: EngineSettings = EngineSettings(),
        fault_hooks: dict[str, str] | None = None,
        silent_generating: float = 10.0,
        silent_loading: float = 60.0,
        runner_env: dict[str, str] | None = None,
        fetch_shard: FetchShard | None = None, image_bytes: ImageBytes | None = None,
        stalled: Callable[[float, float], float] | None = None,  # the node's own loop stalls (worker.liveness)
    ) -> None:
        self._fetch_shard, self._image_bytes = fetch_shard, image_bytes
        self._downloads: dict[str, tuple[LocalRunner, trio.CancelScope]] = {}
        self.node_id = node_id
        self._runner_env = runner_env
        self.boot_id = boot_id
        self._get_state = get_state
        self._emit_event = emit
        self._on_chunk = on_chunk
        self._resolve_model = resolve_model
        self._engine = engine
        self._fault_hooks = dict(fault_hooks or {})
        self._silent, self._stalled = (silent_generating, silent_loading), stalled
        self.supervisors: dict[str, RunnerSupervisor] = {}
        self._failed: dict[str, LocalRunner] = {}
        self._wake = trio.Event()
        self._nursery: trio.Nursery | None = None

    def wake(self) -> None:
        self._wake.set()

    def _emit(self, event: Event) -> None:
        self._emit_event(event)
        self.wake()

    def local_runners(self) -> dict[str, LocalRunner]:
        """This node's runners as ``plan`` sees them (including ended ones, so a runner id
        is never created twice)."""
        view = dict(self._failed)
        view.update({rid: runner for rid, (runner, _) in self._downloads.items()})
        for rid, sup in self.supervisors.items():
            view[rid] = LocalRunner(rid, sup.instance.instance_id, sup.status, frozenset(sup.sent))
        return view

    def hosted_bytes(self) -> int:
        """Bytes of the shards of live runners on this node (for ``--memory-limit``)."""
        return sum(s.shard.share_bytes for s in self.supervisors.values() if not isinstance(s.status, TERMINAL_STATUSES))

    def _kv_budget(self) -> int | None:
        """Bytes of KV cache a runner created now may hold: ``--kv-cache-bytes`` when given,
        else what this node's memory leaves beside the shards State places on it —
        ``min(memory_available, memory_total − Σ share_bytes)`` from this node's profile (the
        memory placement did not reserve, which admission grants prompts from); None when the
        node has not reported its memory (no check)."""
        if self._engine.kv_cache_bytes is not None:
            return self._engine.kv_cache_bytes
        state = self._get_state()
        profile = state.nodes.get(self.node_id)  # type: ignore[call-overload]
        if profile is None or profile.memory_available is None:
            return None
        usable = profile.memory_available
        if profile.memory_total is not None:
            placed = sum(s.share_bytes for i in state.instances.values() if i.failed_reason is None
                         for s in i.shards if s.node_id == self.node_id)
            usable = min(usable, profile.memory_total - placed)
        return max(0, usable)

    def runner_figures(self) -> list[tuple[str, str, int, EngineStats]]:
        """(instance id, model id, rank, the engine's last figures) of each live runner of
        this node that has reported them (``worker.runner.stats``)."""
        out = []
        for sup in self.supervisors.values():
            stats = sup.engine_stats
            if stats is not None and not isinstance(sup.status, TERMINAL_STATUSES):
                out.append((sup.instance.instance_id, sup.instance.model_id, sup.shard.rank, stats))
        return out

    def runner_pids(self) -> list[int]:
        return [s.pid for s in self.supervisors.values() if s.pid is not None and not s.exited.is_set()]

    async def run(self) -> None:
        """Plan and execute until cancelled; on the way out every runner is shut down."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                while True:
                    self._prune()
                    task = plan(self.node_id, self.boot_id, self._get_state(), self.local_runners())  # type: ignore[arg-type]
                    if task is None:
                        with trio.move_on_after(1.0):
                            await self._wake.wait()
                        self._wake = trio.Event()
                        continue
                    try:
                        await self._execute(task)
                    except Exception:
                        # A bug here must not take the node down; the runner it concerns is
                        # failed so the plan moves on instead of retrying in a loop.
                        log.exception("task execution failed", task=type(task).__name__)
                        self._fail_runner_of(task, "internal error executing a task; see the node log")
        finally:
            with trio.CancelScope(shield=True):
                await self.shutdown_all()

    async def shutdown_all(self, timeout: float = 10.0) -> None:
        """Shut every live runner down (kill after ``timeout`` seconds)."""
        live = [s for s in self.supervisors.values() if not s.exited.is_set()]
        if not live:
            return
        async with trio.open_nursery() as nursery:
            for sup in live:
                nursery.start_soon(sup.shutdown, timeout)

    def _prune(self) -> None:
        state = self._get_state()
        instances = state.instances
        for rid in [r for r, s in self.supervisors.items() if s.exited.is_set() and s.instance.instance_id not in instances]:
            del self.supervisors[rid]
        for sup in self.supervisors.values():
            sup.forget_ended(state.tasks)
        for rid in [r for r, lr in self._failed.items() if lr.instance_id not in instances]:
            del self._failed[rid]

    def _fail_runner_of(self, task: PlannedTask, error: str) -> None:
        runner_id = getattr(task, "runner_id", None) or getattr(getattr(task, "shard", None), "runner_id", None)
        instance_id = getattr(getattr(task, "instance", None), "instance_id", None)
        sup = self.supervisors.get(runner_id) if runner_id else None
        if sup is not None:
            sup.sent.add("shutdown")
            sup._set_status(RunnerFailed(error))
            if self._nursery is not None:
                self._nursery.start_soon(sup.shutdown, 1.0)
        elif runner_id and instance_id:
            status = RunnerFailed(error)
            self._failed[runner_id] = LocalRunner(runner_id, instance_id, status)
            self._emit(RunnerStatusUpdated(runner_id, instance_id, self.node_id, status))  # type: ignore[arg-type]

    async def _execute(self, task: PlannedTask) -> None:
        assert self._nursery is not None
        if isinstance(task, CreateRunner):
            await self._create(task)
            return
        runner_id = task.runner_id
        sup = self.supervisors.get(runner_id)
        if isinstance(task, Shutdown) and runner_id in self._downloads:
            self._cancel_download(runner_id)
            return
        if sup is None:
            return
        if isinstance(task, Shutdown):
            sup.sent.add("shutdown")
            instance = self._get_state().instances.get(sup.instance.instance_id)
            # A failed instance's group is broken: its runners may be blocked in a collective
            # that never returns, so they get 1 s, not the graceful 10 s of a deletion.
            timeout = 1.0 if instance is not None and instance.failed_reason is not None else 10.0
            self._nursery.start_soon(sup.shutdown, timeout)
        elif isinstance(task, ConnectToGroup):
            await sup.send(task, "connect")
        elif isinstance(task, LoadModel):
            await sup.send(task, "load")
        elif isinstance(task, StartWarmup):
            await sup.send(task, "warmup")
        elif isinstance(task, CancelTask):
            await sup.send(task, f"cancel:{task.task_id}")
        elif isinstance(task, ForwardTask):
            await forward_work(sup, task.task, self._image_bytes, self._nursery)  # images first (worker.vision.delivery)

    async def _create(self, task: CreateRunner) -> None:
        try:
            model_dir = await trio.to_thread.run_sync(self._resolve_model, task.instance.model_id)
        except ModelNotFoundError as exc:
            if self._fetch_shard is not None and task.instance.model_digest:
                self._start_download(task)
            else:
                self._fail_create(task, f"cannot prepare model {task.instance.model_id!r} on node {self.node_id}: {exc}")
            return
        except Exception as exc:
            self._fail_create(task, f"cannot prepare model {task.instance.model_id!r} on node {self.node_id}: {exc}")
            return
        await self._start_supervisor(task, model_dir)

    def _fail_create(self, task: CreateRunner, error: str) -> None:
        """Record the runner of ``task`` as Failed with ``error`` (no process was started)."""
        shard = task.shard
        log.error("runner not created", runner_id=shard.runner_id, error=error)
        status = RunnerFailed(error)
        self._failed[shard.runner_id] = LocalRunner(shard.runner_id, task.instance.instance_id, status)
        self._emit(RunnerStatusUpdated(shard.runner_id, task.instance.instance_id, self.node_id, status))  # type: ignore[arg-type]

    # -- shards fetched from peers (docs/models.md) ------------------------------------------
    def _set_download(self, task: CreateRunner, status: RunnerDownloading, scope: trio.CancelScope) -> None:
        rid, iid = task.shard.runner_id, task.instance.instance_id
        self._downloads[rid] = (LocalRunner(rid, iid, status), scope)
        self._emit(RunnerStatusUpdated(rid, iid, self.node_id, status))  # type: ignore[arg-type]

    def _start_download(self, task: CreateRunner) -> None:
        assert self._nursery is not None
        scope = trio.CancelScope()
        self._set_download(task, RunnerDownloading(0, 0), scope)
        self._nursery.start_soon(self._download, task, scope)

    def _cancel_download(self, runner_id: str) -> None:
        """A deleted (or failed) instance's download stops; its runner counts as shut down."""
        runner, scope = self._downloads.pop(runner_id)
        scope.cancel()
        status = RunnerShutdown()
        self._failed[runner_id] = LocalRunner(runner_id, runner.instance_id, status, frozenset({"shutdown"}))
        self._emit(RunnerStatusUpdated(runner_id, runner.instance_id, self.node_id, status))  # type: ignore[arg-type]

    async def _download(self, task: CreateRunner, scope: trio.CancelScope) -> None:
        assert self._fetch_shard is not None
        rid = task.shard.runner_id
        last = [-DOWNLOAD_STATUS_INTERVAL]
        began: list[tuple[float, int]] = []  # (time, bytes done) of the first report

        def progress(done: int, total: int, from_peers: int = 0, from_hub: int = 0) -> None:
            now = trio.current_time()
            if not began:
                began.append((now, done))
            if rid in self._downloads and (done >= total or now - last[0] >= DOWNLOAD_STATUS_INTERVAL):
                last[0] = now
                t0, d0 = began[0]
                speed = (done - d0) / (now - t0) if now > t0 else 0.0
                status = RunnerDownloading(done, total, round(speed, 1), from_peers, from_hub)
                self._set_download(task, status, scope)

        with scope:
            try:
                model_dir = await self._fetch_shard(task.instance, task.shard, progress)
            except Exception as exc:
                if self._downloads.pop(rid, None) is not None:
                    self._fail_create(task, f"cannot fetch the shard of model {task.instance.model_id!r} "
                                            f"on node {self.node_id}: {exc}")
                return
            if self._downloads.pop(rid, None) is None:
                return  # cancelled meanwhile
            await self._start_supervisor(task, model_dir)

    async def _start_supervisor(self, task: CreateRunner, model_dir: Path) -> None:
        assert self._nursery is not None
        shard = task.shard
        # the instance's rank settings (every rank the same) and this node's resolved KV budget
        settings = self._engine.for_runner(task.instance.settings, self._kv_budget())
        sup = RunnerSupervisor(self.node_id, task.instance, shard, model_dir, self._emit, self._on_chunk,
                               engine=settings, fault_hooks=self._fault_hooks, env=self._runner_env,
                               liveness=LivenessBounds(*self._silent, stalled=self._stalled))
        self.supervisors[shard.runner_id] = sup
        await self._nursery.start(sup.run)
