"""The runner process: holds one shard of one instance and runs it (design.md §3, §5).

Started by the worker's supervisor as ``python -m worker.runner.main --in-fd N --out-fd M``.
It reads ``RunnerSetup`` and then tasks from ``in-fd``, and writes status, chunks and
heartbeats to ``out-fd``. States: Idle → Loading(layers) → Loaded → WarmingUp → Ready ⇄
Running → ShuttingDown → Shutdown, Failed(error) from anywhere. It exits by itself when its
node dies: end of file on ``in-fd`` (the node's end closed) or the parent-death signal.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import sys
import threading
import time
import traceback

import msgspec

from exo_p2p.types import (
    CancelTask,
    ConnectToGroup,
    CreateRunner,
    ErrorChunk,
    FinishChunk,
    LoadModel,
    RunnerFailed,
    RunnerLoaded,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    RunnerShutdown,
    RunnerShuttingDown,
    RunnerStatus,
    RunnerWarmingUp,
    Shutdown,
    StartWarmup,
    TextGeneration,
)
from worker.runner.protocol import (
    ChunkMsg,
    HeartbeatMsg,
    RunnerSetup,
    StatusMsg,
    TaskStatusMsg,
    frame,
    read_frame,
    to_runner_decoder,
    write_all,
)

_EOF = object()


def _watch_parent(parent_pid: int, interval: float = 0.5) -> None:
    """Exit at once when the node process that started us is gone.

    The task pipe's end of file usually tells first (the reader thread exits then); this
    catches the rest. Linux's parent-death signal is not used: it fires when the *thread*
    that forked us exits, and trio forks from a worker thread that it retires when idle.
    """
    while True:
        time.sleep(interval)
        if os.getppid() != parent_pid:
            os._exit(0)


class RunnerProcess:
    """The runner's main loop. ``tasks`` is fed by a reader thread from ``in_fd``."""

    def __init__(self, in_fd: int, out_fd: int) -> None:
        self.in_fd = in_fd
        self.out_fd = out_fd
        self.tasks: queue.Queue[object] = queue.Queue()
        self._write_lock = threading.Lock()
        self.setup: RunnerSetup | None = None
        self.status: RunnerStatus | None = None
        self.loaded = None
        self.generator = None
        self.running_tasks: set[str] = set()

    # --- output -------------------------------------------------------------------------
    def send(self, message: object) -> None:
        with self._write_lock:
            write_all(self.out_fd, frame(message))

    def set_status(self, status: RunnerStatus) -> None:
        self.status = status
        self.send(StatusMsg(status))

    # --- input --------------------------------------------------------------------------
    def _reader(self) -> None:
        try:
            while True:
                payload = read_frame(self.in_fd)
                if payload is None:
                    os._exit(0)  # our node closed the pipe or died: exit now, even mid-load
                try:
                    self.tasks.put(to_runner_decoder.decode(payload))
                except msgspec.DecodeError as exc:
                    print(f"runner: dropped undecodable message: {exc}", file=sys.stderr)
        except (OSError, ValueError) as exc:
            print(f"runner: input closed: {exc}", file=sys.stderr)
        self.tasks.put(_EOF)

    # --- main loop ----------------------------------------------------------------------
    def run(self) -> int:
        threading.Thread(target=self._reader, name="runner-input", daemon=True).start()
        first = self.tasks.get()
        if not isinstance(first, RunnerSetup):
            return 2
        self.setup = first
        interval = first.heartbeat_interval
        last_sent = time.monotonic()
        while True:
            busy = self.generator is not None and self.generator.has_work()
            try:
                item = self.tasks.get_nowait() if busy else self.tasks.get(timeout=interval)
            except queue.Empty:
                item = None
            if item is _EOF:
                return 0  # our node is gone: exit, no orphans
            if item is not None:
                try:
                    if self.handle(item) == "exit":
                        return 0
                except Exception as exc:  # a failure in a lifecycle task fails the runner
                    traceback.print_exc()
                    self.set_status(RunnerFailed(f"{type(exc).__name__}: {exc}"))
                    return 1
                last_sent = time.monotonic()
                continue
            if busy:
                self.step_generation()
                last_sent = time.monotonic()
            elif time.monotonic() - last_sent >= interval:
                self.send(HeartbeatMsg())
                last_sent = time.monotonic()

    def handle(self, task: object) -> str | None:
        assert self.setup is not None
        hooks = self.setup.fault_hooks
        if isinstance(task, ConnectToGroup):
            if self.setup.shard.world_size > 1:
                raise RuntimeError("multi-node instances are not supported by this runner yet")
            return None
        if isinstance(task, LoadModel):
            self.load(hooks)
            return None
        if isinstance(task, StartWarmup):
            self.set_status(RunnerWarmingUp())
            if hooks.get("stall") == "warmup":
                time.sleep(3600)
            self.warmup()
            self.set_status(RunnerReady())
            return None
        if isinstance(task, TextGeneration):
            self.submit(task)
            return None
        if isinstance(task, CancelTask):
            if self.generator is not None:
                self.generator.cancel(task.task_id)
            return None
        if isinstance(task, Shutdown):
            self.set_status(RunnerShuttingDown())
            self.generator = None
            self.loaded = None
            self.set_status(RunnerShutdown())
            return "exit"
        if isinstance(task, CreateRunner):
            return None
        raise TypeError(f"unexpected task {type(task).__name__}")

    def load(self, hooks: dict[str, str]) -> None:
        from worker.engine.loader import LoadProgress, load_model

        assert self.setup is not None
        shard = self.setup.shard
        total = shard.end_layer - shard.start_layer
        self.set_status(RunnerLoading(0, total))
        if hooks.get("fail") == "loading":
            raise RuntimeError("fault hook: failure during load")
        if hooks.get("stall") == "loading":
            time.sleep(3600)
        loaded = None
        for item in load_model(self.setup.model_dir, start_layer=shard.start_layer, end_layer=shard.end_layer):
            if isinstance(item, LoadProgress):
                self.set_status(RunnerLoading(item.layers_loaded, item.layers_total))
            else:
                loaded = item
        assert loaded is not None
        self.loaded = loaded
        from worker.engine.generator import Generator

        self.generator = Generator(loaded, model_id=self.setup.instance.model_id, prefill_chunk_size=self.setup.prefill_chunk_size)
        self.set_status(RunnerLoaded(peak_memory_bytes=int(getattr(loaded, "peak_memory_bytes", 0))))

    def warmup(self) -> None:
        """Generate a few tokens (greedy, discarded) so the first request does not pay for
        first-use costs; bounded by its ``max_tokens``. A model without a chat template is
        warmed up all the same (the error chunk is discarded)."""
        from worker.engine.generator import GenerationRequest

        assert self.generator is not None
        self.generator.submit(
            GenerationRequest(task_id="warmup", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0.0)
        )
        for _ in range(100):
            if not self.generator.has_work():
                break
            self.generator.step()

    def submit(self, task: TextGeneration) -> None:
        from worker.engine.generator import GenerationRequest

        assert self.generator is not None
        self.generator.submit(GenerationRequest.from_params(task.task_id, task.params))

    def step_generation(self) -> None:
        assert self.generator is not None
        if not isinstance(self.status, RunnerRunning):
            self.set_status(RunnerRunning())
        for chunk in self.generator.step():
            if chunk.task_id not in self.running_tasks and not isinstance(chunk, (FinishChunk, ErrorChunk)):
                self.running_tasks.add(chunk.task_id)
                self.send(TaskStatusMsg(chunk.task_id, "running"))
            self.send(ChunkMsg(chunk))
            if isinstance(chunk, FinishChunk):
                self.running_tasks.discard(chunk.task_id)
                self.send(TaskStatusMsg(chunk.task_id, "cancelled" if chunk.finish_reason == "cancelled" else "complete"))
            elif isinstance(chunk, ErrorChunk):
                self.running_tasks.discard(chunk.task_id)
                self.send(TaskStatusMsg(chunk.task_id, "failed"))
        if not self.generator.has_work():
            self.set_status(RunnerReady())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="exo-p2p-runner")
    parser.add_argument("--in-fd", type=int, required=True)
    parser.add_argument("--out-fd", type=int, required=True)
    args = parser.parse_args(argv)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), name="parent-watch", daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the node decides when we stop
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    runner = RunnerProcess(args.in_fd, args.out_fd)
    try:
        return runner.run()
    except BrokenPipeError:
        return 0  # the node is gone


if __name__ == "__main__":
    sys.exit(main())
