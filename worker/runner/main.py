"""The runner process: holds one shard of one instance and runs it (docs/architecture.md#vocabulary).

Started by the worker's supervisor as ``python -m worker.runner.main --in-fd N --out-fd M``.
It reads ``RunnerSetup`` and then tasks from ``in-fd``, and writes status, chunks and
heartbeats to ``out-fd``. States: Idle → (Connecting → Connected, multi-rank only) →
Loading(layers) → Loaded → WarmingUp → Ready ⇄ Running → ShuttingDown → Shutdown,
Failed(error) from anywhere. It exits by itself when its node dies: end of file on ``in-fd``
(the node's end closed) or its parent gone (``worker.runner.startup``).

Its parts, over the seam of ``worker.engine.base``: the ``Builder`` chosen by the model's
kind (``worker.runner.builders``), driven by the lifecycle tasks (``worker.runner.lifecycle``:
join the ring, load only this rank's share, build and warm up), the ``Engine`` it built, and on
a multi-rank instance the agreement rounds (``worker.runner.rounds``, paced by
``worker.runner.pace``): once Ready, work tasks, cancels and Shutdown are decided in rounds
every rank runs at the same points. What it sends goes through its ``Outbox``
(``worker.runner.outbox``). Every rank reports task status; rank 0 alone emits the chunks (every rank holds the
same tokens and tokenizer, so rank 0's text is the instance's text). Heartbeats come from a
thread of their own (``worker.runner.pulse``), however long a step computes, and say which
unit of work the main thread is in and for how long: a rank blocked in a collective because a
peer vanished reports one step that never ends, and its supervisor kills it as stuck
(``worker.liveness``); a collective that fails (a reset ring link: MLX fails the pending work
and that socket never works again) fails the runner at once
(``worker.engine.pipeline.StageFailed``), not only the request.
"""

from __future__ import annotations

import argparse
import functools
import os
import queue
import signal
import sys
import threading
import time
import traceback

import msgspec

from exo_p2p.types import (WORK_TASKS, CancelTask, ConnectToGroup, CreateRunner, ErrorChunk, FinishChunk, LoadModel,
                          RunnerFailed, RunnerReady, RunnerRunning, RunnerShutdown, RunnerShuttingDown, RunnerStatus,
                          Shutdown, StartWarmup, WorkTask)
from worker.engine.base import Builder, Engine
from worker.runner import lifecycle
from worker.runner.builders import choose_builder
from worker.runner.faults import NO_FAULTS, RunnerFaults
from worker.runner.outbox import Outbox
from worker.runner.pace import IDLE_ROUND_INTERVAL
from worker.runner.priority import lower_this_thread
from worker.vision.inbox import RUNNER_IMAGES
from worker.runner.protocol import INPUT_CLOSED, ImageData, RunnerSetup, StatusMsg, read_frame, to_runner_decoder
from worker.runner.pulse import Pulse, start_heartbeat
from worker.runner.rounds import Rounds
from worker.runner.startup import preload, watch_parent


class RunnerProcess:
    """The runner's main loop over the seam (``worker.engine.base``): its I/O (``in_fd``, the
    ``tasks`` queue fed by a reader thread, the ``out`` box), ``pulse`` and ``status``, and
    what it runs: the ``builder`` chosen by the model's kind, the ``engine`` it built, and on
    a multi-rank instance the agreement ``rounds``. No other module sets its fields."""

    def __init__(self, in_fd: int, out_fd: int) -> None:
        self.in_fd = in_fd
        self.tasks: queue.Queue[object] = queue.Queue()
        self.out = Outbox(out_fd)
        self.pulse = Pulse()
        self.status: RunnerStatus | None = None
        self.faults = NO_FAULTS
        self.setup: RunnerSetup | None = None
        self.builder: Builder | None = None
        self.engine: Engine | None = None
        self.rounds: Rounds | None = None

    # --- output -------------------------------------------------------------------------
    def set_status(self, status: RunnerStatus) -> None:
        self.status = status
        self.out.send(StatusMsg(status))

    def shut_down(self) -> None:
        """Let go of the engine and the weights, reporting ShuttingDown then Shutdown."""
        self.set_status(RunnerShuttingDown())
        if self.engine is not None:
            self.engine.close()
        self.engine = self.builder = None
        self.set_status(RunnerShutdown())

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
        self.tasks.put(INPUT_CLOSED)

    # --- main loop ----------------------------------------------------------------------
    def run(self) -> int:
        threading.Thread(target=self._reader, name="runner-input", daemon=True).start()
        first = self.tasks.get()
        if not isinstance(first, RunnerSetup):
            return 2
        self.setup = first
        self.faults = RunnerFaults.from_hooks(first.fault_hooks) if first.fault_hooks else NO_FAULTS
        self.out.of_rank(first.shard.rank)
        start_heartbeat(self.pulse, self.out.send, first.heartbeat_interval)
        lower_this_thread()  # the compute below the node; the heartbeat thread keeps its priority
        while True:
            if self.rounds is None:
                code = self.turn(first.heartbeat_interval)
            else:
                try:
                    code = self.serve_round()
                except Exception as exc:  # a collective failed (StageFailed, a round's all-gather)
                    traceback.print_exc()
                    self.set_status(RunnerFailed(f"a collective failed, the ranks cannot go on in step: {exc}"))
                    return 1
            if code is not None:
                return code

    def turn(self, interval: float) -> int | None:
        """One turn of a runner without rounds: one message handled, or one engine step, or
        an idle wait of ``interval`` seconds. Returns an exit code, or None to go on."""
        busy = self.engine is not None and self.engine.has_work()
        try:
            item = self.tasks.get_nowait() if busy else self.tasks.get(timeout=interval)
        except queue.Empty:
            item = None
        if item is INPUT_CLOSED:
            return 0  # our node is gone: exit, no orphans
        if item is not None:
            return self.handle_item(item)
        if busy:
            self.step()
        elif self.engine is not None:
            self.out.note_stats(self.engine, self.pulse)  # digests kept back by the gap
        return None

    def serve_round(self) -> int | None:
        """One turn of a serving multi-rank runner: take input, run an agreement round when
        this is an agreement point (identical on every rank), do one step."""
        assert self.engine is not None and self.rounds is not None
        deadline = time.monotonic() + (0.0 if self.engine.has_work() else IDLE_ROUND_INTERVAL)
        while True:
            wait = deadline - time.monotonic()
            try:
                item = self.tasks.get(timeout=wait) if wait > 0 else self.tasks.get_nowait()
            except queue.Empty:
                break
            if item is INPUT_CLOSED:
                return 0
            if (code := self.handle_item(item)) is not None:
                return code
        if self.rounds.due(self.engine):
            with self.pulse.unit("round"):
                outcome = self.rounds.round(self.engine)
            for task_id in outcome.dropped:
                self.out.cancelled(task_id)
            if outcome.shutdown:
                self.shut_down()
                return 0
        if self.engine.has_work():
            decoding = not self.engine.must_agree()
            started = time.monotonic()
            self.step()
            self.rounds.stepped(time.monotonic() - started, decoding)
        return None

    def handle_item(self, item: object) -> int | None:
        """Handle one message from the node as one unit of work (``worker.runner.pulse``);
        a failure in a lifecycle task fails the runner. Returns an exit code, or None."""
        kind = {LoadModel: "load", StartWarmup: "warmup", ConnectToGroup: "connect"}.get(type(item), "task")
        try:
            with self.pulse.unit(kind):
                if self.handle(item) == "exit":
                    return 0
        except Exception as exc:
            traceback.print_exc()
            self.set_status(RunnerFailed(f"{type(exc).__name__}: {exc}"))
            return 1
        return None

    def handle(self, task: object) -> str | None:
        assert self.setup is not None
        if isinstance(task, ConnectToGroup) and self.setup.shard.world_size > 1:
            self.builder = choose_builder(self.setup, self.faults)
            lifecycle.connect(self.builder, self.set_status, self.out.out_fd)
        elif isinstance(task, LoadModel):
            self.builder = self.builder or choose_builder(self.setup, self.faults)
            lifecycle.load(self.builder, self.set_status, self.pulse, self.setup)
        elif isinstance(task, StartWarmup):
            if self.builder is None:
                raise RuntimeError("warm-up before the model was loaded")
            built = functools.partial(self.out.note_stats, pulse=self.pulse, force=True)
            self.engine, self.rounds = lifecycle.warmup(self.builder, self.set_status, self.pulse, self.setup, built)
        elif isinstance(task, WORK_TASKS):
            self.submit(task)  # type: ignore[arg-type]
        elif isinstance(task, ImageData):  # a coming task's image (worker.vision.inbox)
            RUNNER_IMAGES.put(task.digest, task.data)
        elif isinstance(task, CancelTask):
            if self.rounds is not None:
                self.rounds.want_cancel(task.task_id)
            elif self.engine is not None:
                self.engine.cancel(task.task_id)
        elif isinstance(task, Shutdown) and self.rounds is not None:
            self.rounds.want_shutdown()  # every rank shuts down after the next round
        elif isinstance(task, Shutdown):
            self.shut_down()
            return "exit"
        elif not isinstance(task, (CreateRunner, ConnectToGroup)):
            raise TypeError(f"unexpected task {type(task).__name__}")
        return None

    def submit(self, task: WorkTask) -> None:
        if self.engine is None:
            raise RuntimeError(f"task {task.task_id} before the runner was ready")
        if self.rounds is None:
            self.engine.submit(task)
        elif not self.rounds.add(task):
            self.out.cancelled(task.task_id)

    def step(self) -> None:
        """One engine step as one ``step`` unit of work, its chunks and task statuses sent."""
        assert self.engine is not None
        if not isinstance(self.status, RunnerRunning):
            self.set_status(RunnerRunning())
        with self.pulse.unit("step"):
            self.faults.before_step()
            chunks = self.engine.step()
        self.out.note_stats(self.engine, self.pulse, force=any(isinstance(c, (FinishChunk, ErrorChunk)) for c in chunks))
        for task_id in self.out.chunks(chunks):
            if self.rounds is not None:
                self.rounds.finished(task_id)
        if not self.engine.has_work():
            self.set_status(RunnerReady())


def _low_preload() -> None:
    """The preload at the compute's priority (the BLAS pool its imports create inherits it)."""
    lower_this_thread()
    preload()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="exo-p2p-runner")
    parser.add_argument("--in-fd", type=int, required=True)
    parser.add_argument("--out-fd", type=int, required=True)
    args = parser.parse_args(argv)
    from exo_p2p.limits import guard_setrlimit
    from exo_p2p.logs.configure import configure_runner_output

    guard_setrlimit()  # before the preload imports mlx-lm, which would lower the open-file limit (exo_p2p.limits)

    configure_runner_output()  # the node's log format for prints, warnings, tracebacks
    threading.Thread(target=watch_parent, args=(os.getppid(),), name="parent-watch", daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the node decides when we stop
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    threading.Thread(target=_low_preload, name="preload", daemon=True).start()  # after the env above
    runner = RunnerProcess(args.in_fd, args.out_fd)
    try:
        code = runner.run()
    except BrokenPipeError:
        code = 0  # the node is gone
    if runner.builder is not None and runner.builder.connected:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # do not wait on the ring's sockets (a peer may be gone)
    return code


if __name__ == "__main__":
    sys.exit(main())
