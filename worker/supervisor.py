"""Runner supervision: start a runner subprocess, relay its messages, notice its death.

One ``RunnerSupervisor`` per runner (its process and pipes: ``worker.runner_spawn``). It turns
the runner's messages into events (runner status, task status) and chunks, kills a runner
whose ring gave up (``worker.runner_output``) or that is silent or stuck (``worker.liveness``:
nothing heard for 10 s once serving, 60 s before; one step running past the larger of 45 s
and 5 × its longest recent step; no layer loaded for 60 s), and reports ``Failed`` with the
reason when the process dies on its own. Closing the node's end of the task pipe makes the
runner exit; so does its parent's exit (``worker.runner.startup``) when the node is killed.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Container, Mapping
from pathlib import Path

import msgspec
import structlog
import trio

from exo_p2p.config import RUNNER_OUTPUT_DRAIN
from exo_p2p.types import (FINISHED_TASK_STATUSES, TERMINAL_STATUSES, Chunk, Event, Instance,
                           InstancePrefixesUpdated, RunnerFailed, RunnerIdle, RunnerLoaded, RunnerShutdown,
                           RunnerStatus, RunnerStatusUpdated, ShardMetadata, Task, TaskStatusUpdated)
from exo_p2p.types.engine import EngineSettings
from exo_p2p.types.observe import EngineStats
from worker.liveness import LivenessBounds, liveness_fault, own_stall
from worker.plan import still_listed
from worker.runner.protocol import (ChunkMsg, FrameReader, FrameTooLarge, HeartbeatMsg, PrefixesMsg, RunnerSetup,
                                    StatusMsg, TaskStatusMsg, frame, to_supervisor_decoder)
from worker.runner_output import ring_failure
from worker.runner_spawn import relay_to_log, spawn_runner
from worker.task_ends import TaskEnds

log = structlog.get_logger(__name__)


class RunnerSupervisor:
    """Owns one runner process.

    ``emit(event)`` receives ``RunnerStatusUpdated`` / ``TaskStatusUpdated`` events,
    ``on_chunk(chunk)`` the runner's chunks; both are plain callbacks that must not block.
    ``status`` is the latest status; ``sent`` the keys of tasks sent (see ``worker.plan``).
    ``env``: the runner's environment (None: the node's own); the worker passes
    ``worker.blas.runner_environment`` so the runner loads the optimised BLAS. ``engine``:
    the runner's engine settings, sent in its ``RunnerSetup`` (``Worker`` passes this node's,
    narrowed by ``EngineSettings.for_runner``: ``kv_cache_bytes`` the resolved budget, bytes).
    ``liveness``: the silence and stuck bounds (``worker.liveness.LivenessBounds``, seconds).
    """

    def __init__(
        self,
        node_id: str,
        instance: Instance,
        shard: ShardMetadata,
        model_dir: Path,
        emit: Callable[[Event], None],
        on_chunk: Callable[[Chunk], None],
        *,
        engine: EngineSettings = EngineSettings(),
        fault_hooks: dict[str, str] | None = None,
        liveness: LivenessBounds = LivenessBounds(),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.node_id = node_id
        self._env = dict(env) if env is not None else None
        self.instance = instance
        self.shard = shard
        self.runner_id = shard.runner_id
        self.model_dir = model_dir
        self._emit = emit
        self._on_chunk = on_chunk
        self.status: RunnerStatus = RunnerIdle()
        self.sent: set[str] = set()
        self._task_ends = TaskEnds(self.runner_id, shard.rank)
        self.process: trio.Process | None = None
        self._send_stream: trio.lowlevel.FdStream | None = None
        self._receive_stream: trio.lowlevel.FdStream | None = None
        self._send_lock = trio.Lock()
        # set once the runner has its setup (or its process could not start): the worker may
        # plan this runner's next task (its status is Idle from construction) while the
        # process is still being started, and that task must follow the setup, never fail
        self._writable = trio.Event()
        self._last_heard = trio.current_time()
        self._setup = RunnerSetup(instance=instance, shard=shard, model_dir=str(model_dir), engine=engine,
                                  fault_hooks=dict(fault_hooks or {}))
        self._liveness = liveness
        self._beat: tuple[HeartbeatMsg, float] | None = None  # the last heartbeat, when it came
        self._ring_failed: str | None = None  # MLX's line saying the ring gave up on a socket
        self.exited = trio.Event()

    @property
    def engine_stats(self) -> EngineStats | None:
        """The engine's figures in the runner's last heartbeat (None before warm-up)."""
        return self._beat[0].stats if self._beat is not None else None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def _set_status(self, status: RunnerStatus) -> None:
        self.status = status
        self._emit(RunnerStatusUpdated(self.runner_id, self.instance.instance_id, self.node_id, status))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the runner and supervise it until it exits. Cancelling this kills it.

        The runner's fds 1 and 2 are a pipe whose lines are relayed to the node's log, as JSON
        lines with the node's JSON log format, unchanged otherwise, and watched for MLX's ring
        giving up (``worker.runner_output``)."""
        async with trio.open_nursery() as relays:
            output_r, output_w = os.pipe()
            try:
                await self._start_process(output_w)
            except BaseException:
                os.close(output_r)
                self._writable.set()  # sends now fail at once (no process), never wait
                raise
            finally:
                os.close(output_w)
            relays.start_soon(self._relay_output, trio.lowlevel.FdStream(output_r))
            await self._supervise(task_status)
            relays.cancel_scope.deadline = trio.current_time() + RUNNER_OUTPUT_DRAIN  # EOF comes with the exit

    async def _start_process(self, output_fd: int | None) -> None:
        self.process, self._send_stream, self._receive_stream = await spawn_runner(self._env, output_fd)

    async def _relay_output(self, stream: trio.lowlevel.FdStream) -> None:
        def watch(line: str) -> None:
            if self._ring_failed is None:
                self._ring_failed = ring_failure(line)

        await relay_to_log(stream, self._env, {"runner_id": self.runner_id, "pid": self.pid}, watch)

    async def _supervise(self, task_status: trio.TaskStatus[None]) -> None:
        receive = self._receive_stream
        assert self.process is not None and receive is not None
        log.info("runner started", runner_id=self.runner_id, pid=self.process.pid, rank=self.shard.rank)
        self._set_status(RunnerIdle())
        try:
            await self._write(self._setup)
        finally:
            self._writable.set()
        self._last_heard = trio.current_time()
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watchdog, nursery.cancel_scope)
                await self._read(receive)
                nursery.cancel_scope.cancel()
            await self._reap()
        except Exception as exc:  # supervision itself failed: fail the runner, keep the node
            log.exception("runner supervision failed", runner_id=self.runner_id)
            if not isinstance(self.status, TERMINAL_STATUSES):
                self._set_status(RunnerFailed(f"runner supervision failed: {exc}"))
        finally:
            with trio.CancelScope(shield=True):
                await self._kill_and_reap()
                await receive.aclose()
                if self._send_stream is not None:
                    await self._send_stream.aclose()
                self.exited.set()

    async def _read(self, receive: trio.lowlevel.FdStream) -> None:
        frames = FrameReader()
        while True:
            try:
                data = await receive.receive_some(1 << 20)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            if not data:
                return
            try:
                payloads = frames.feed(data)
            except FrameTooLarge as exc:
                log.error("runner sent an oversized frame; killing it", runner_id=self.runner_id, length=exc.length)
                return
            for payload in payloads:
                self._last_heard = trio.current_time()
                try:
                    msg = to_supervisor_decoder.decode(payload)
                except msgspec.DecodeError as exc:
                    log.warning("undecodable runner message dropped", runner_id=self.runner_id, error=str(exc))
                    continue
                self._handle(msg)

    def _handle(self, msg: object) -> None:
        if isinstance(msg, HeartbeatMsg):
            self._beat = (msg, trio.current_time())
        elif isinstance(msg, StatusMsg):
            if isinstance(msg.status, RunnerLoaded):
                log.info("runner loaded", runner_id=self.runner_id, rank=self.shard.rank,
                         weights_dtype=self.shard.weights_dtype, share_bytes=self.shard.share_bytes,
                         peak_memory_bytes=msg.status.peak_memory_bytes)
            self._set_status(msg.status)
        elif isinstance(msg, ChunkMsg):
            self._task_ends.count(msg.chunk)
            self._on_chunk(msg.chunk)
        elif isinstance(msg, PrefixesMsg):
            self._emit(InstancePrefixesUpdated(self.instance.instance_id, msg.digests))
        elif isinstance(msg, TaskStatusMsg):
            self._emit(TaskStatusUpdated(msg.task_id, msg.status))
            if msg.status in FINISHED_TASK_STATUSES:
                self._task_ends.log_end(msg.task_id, msg.status)

    def _liveness_fault(self) -> str | None:
        """Why the runner must be killed now (its ring failed, or silent or stuck:
        ``worker.liveness``), or None."""
        if isinstance(self.status, TERMINAL_STATUSES):
            return None
        if self._ring_failed is not None:
            log.error("runner's ring failed; killing it", runner_id=self.runner_id, line=self._ring_failed)
            return f"its ring failed ({self._ring_failed}); killed"
        now = trio.current_time()
        beat, at = self._beat if self._beat is not None else (None, now)
        silent = now - self._last_heard
        fault = liveness_fault(_tag(self.status), silent, beat, now - at, self._liveness, own_stall(self._liveness, silent))
        if fault is not None:
            log.error(f"runner {fault.kind}; killing it", runner_id=self.runner_id, reason=fault.reason,
                      busy=beat.busy if beat is not None else None)
        return fault.reason if fault is not None else None

    async def _watchdog(self, scope: trio.CancelScope) -> None:
        while True:
            await trio.sleep(0.5)
            fault = self._liveness_fault()
            if fault is None:
                continue
            self._set_status(RunnerFailed(fault))
            self._kill()
            scope.cancel()
            return

    async def _reap(self) -> None:
        assert self.process is not None
        with trio.move_on_after(5):
            await self.process.wait()
        await self._kill_and_reap()
        code = self.process.returncode
        if not isinstance(self.status, TERMINAL_STATUSES):
            how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
            self._set_status(RunnerFailed(f"runner process {how}"))
        log.info("runner exited", runner_id=self.runner_id, code=code, status=_tag(self.status))

    def _kill(self) -> None:
        """SIGKILL the runner process if it runs."""
        if self.process is not None and self.process.returncode is None:
            try:
                self.process.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def _kill_and_reap(self) -> None:
        if self.process is not None:
            self._kill()
            await self.process.wait()

    async def _write(self, message: object) -> None:
        if self._send_stream is None:
            raise trio.ClosedResourceError("the runner process was not started")
        async with self._send_lock:
            await self._send_stream.send_all(frame(message))

    def forget_ended(self, tasks: Container[str]) -> None:
        """Drop from ``sent`` the keys of tasks State (``tasks``: its task ids) no longer lists
        (``worker.plan.still_listed``)."""
        self.sent = still_listed(self.sent, tasks)

    async def send(self, task: Task, key: str) -> None:
        """Send ``task`` to the runner, recording ``key`` in ``sent`` first (so a failed
        send is not retried in a loop; the runner's death is reported by ``run``). A task sent
        while the process is still starting waits until the runner has its setup (the
        process start's own time, bounded by ``run``)."""
        self.sent.add(key)
        try:
            await self._writable.wait()
            await self._write(task)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.warning("could not send task to runner", runner_id=self.runner_id, error=str(exc))

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Ask the runner to shut down; kill it if it has not exited after ``timeout`` s."""
        from exo_p2p.types import Shutdown

        if self.process is not None and self.process.returncode is None:
            await self.send(Shutdown(runner_id=self.runner_id), "shutdown")
        with trio.move_on_after(timeout):
            await self.exited.wait()
        if not self.exited.is_set():
            await self._kill_and_reap()
            if not isinstance(self.status, TERMINAL_STATUSES):
                self._set_status(RunnerShutdown())


def _tag(status: RunnerStatus) -> str:
    return type(status).__struct_config__.tag  # type: ignore[attr-defined]
