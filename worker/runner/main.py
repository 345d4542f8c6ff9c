"""The runner process: holds one shard of one instance and runs it (docs/architecture.md#vocabulary).

Started by the worker's supervisor as ``python -m worker.runner.main --in-fd N --out-fd M``.
It reads ``RunnerSetup`` and then tasks from ``in-fd``, and writes status, chunks and
heartbeats to ``out-fd``. States: Idle → (Connecting → Connected, multi-rank only) →
Loading(layers) → Loaded → WarmingUp → Ready ⇄ Running → ShuttingDown → Shutdown,
Failed(error) from anywhere. It exits by itself when its node dies: end of file on ``in-fd``
(the node's end closed) or its parent gone (``worker.runner.startup``).

Its parts: the lifecycle tasks (``worker.runner.lifecycle``: join the ring, load only this
rank's share, warm up), the engine (``worker.engine``), and on a multi-rank instance the
agreement rounds (``worker.runner.rounds``, paced by ``worker.runner.pace``): once Ready,
generation tasks, cancels and Shutdown are decided in rounds every rank runs at the same
points. Every rank reports task status; rank 0 alone emits the chunks (every rank holds the
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
import os
import queue
import signal
import sys
import threading
import time
import traceback

import msgspec

from exo_p2p.types import (CancelTask, ConnectToGroup, CreateRunner, ErrorChunk, FinishChunk, LoadModel,
                          RunnerFailed, RunnerReady, RunnerRunning, RunnerShutdown, RunnerShuttingDown,
                          RunnerStatus, Shutdown, StartWarmup, TextGeneration, TokenChunk)
from worker.runner import lifecycle
from worker.runner.faults import NO_FAULTS, RunnerFaults
from worker.runner.protocol import (INPUT_CLOSED, ChunkMsg, PrefixesMsg, RunnerSetup, StatusMsg, TaskStatusMsg,
                                    frame, read_frame, to_runner_decoder, write_all)
from worker.runner.prefill_pace import PrefillPacer
from worker.runner.priority import lower_this_thread
from worker.runner.pulse import Pulse, start_heartbeat
from worker.runner.rounds import serve_round
from worker.runner.startup import preload, watch_parent
from worker.runner.stats import PrefixPublisher, StatsClock, engine_stats


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
        self.engine = None  # built once at warm-up (worker.engine.builder)
        self.running_tasks: set[str] = set()
        self.group = None
        self.agreement = None
        self.all_gather = None
        self.check_every = 1
        self.steps_since_round = 0
        self.decode_steps = 0
        self.decode_seconds = 0.0
        self.pulse = Pulse()
        self.pacer = PrefillPacer()  # long prompts' share of the time while rows decode
        self.faults = NO_FAULTS
        self.stats_clock = StatsClock()
        self.prefixes = PrefixPublisher()
        self.generated = 0
        """Tokens sampled for requests (``EngineStats.generated_tokens_total``)."""
        self.kv_bytes_per_token = 0

    @property
    def multi(self) -> bool:
        return self.setup is not None and self.setup.shard.world_size > 1

    @property
    def emits_chunks(self) -> bool:
        """Rank 0 alone sends the chunks of a multi-rank instance."""
        return self.setup is None or self.setup.shard.rank == 0

    # --- output -------------------------------------------------------------------------
    def send(self, message: object) -> None:
        with self._write_lock:
            write_all(self.out_fd, frame(message))

    def set_status(self, status: RunnerStatus) -> None:
        self.status = status
        self.send(StatusMsg(status))

    def shut_down(self) -> None:
        """Let go of the engine and the weights, reporting ShuttingDown then Shutdown."""
        self.set_status(RunnerShuttingDown())
        self.engine = None
        self.loaded = None
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
        interval = first.heartbeat_interval
        start_heartbeat(self.pulse, self.send, interval)
        lower_this_thread()  # the compute below the node; the heartbeat thread keeps its priority
        while True:
            if self.multi and isinstance(self.status, (RunnerReady, RunnerRunning)):
                try:
                    code = serve_round(self)
                except Exception as exc:  # a collective failed (StageFailed, a round's all-gather)
                    traceback.print_exc()
                    self.set_status(RunnerFailed(f"a collective failed, the ranks cannot go on in step: {exc}"))
                    return 1
                if code is not None:
                    return code
                continue
            busy = self.engine is not None and self.engine.has_work()
            try:
                item = self.tasks.get_nowait() if busy else self.tasks.get(timeout=interval)
            except queue.Empty:
                item = None
            if item is INPUT_CLOSED:
                return 0  # our node is gone: exit, no orphans
            if item is not None:
                code = self.handle_item(item)
                if code is not None:
                    return code
                continue
            if busy:
                self.step_generation()
            else:
                self.note_stats()  # digests kept back by the gap

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
        faults = self.faults
        if isinstance(task, ConnectToGroup):
            if self.multi:
                lifecycle.connect(self, faults)
            return None
        if isinstance(task, LoadModel):
            lifecycle.load(self, faults)
            return None
        if isinstance(task, StartWarmup):
            lifecycle.warmup(self, faults)
            return None
        if isinstance(task, TextGeneration):
            self.submit(task)
            return None
        if isinstance(task, CancelTask):
            if self.agreement is not None:
                self.agreement.want_cancel(task.task_id)
            elif self.engine is not None:
                self.engine.cancel(task.task_id)
            return None
        if isinstance(task, Shutdown) and self.agreement is not None:
            self.agreement.want_shutdown()  # every rank shuts down after the next round
            return None
        if isinstance(task, Shutdown):
            self.shut_down()
            return "exit"
        if isinstance(task, CreateRunner):
            return None
        raise TypeError(f"unexpected task {type(task).__name__}")

    def submit(self, task: TextGeneration) -> None:
        assert self.engine is not None
        if self.agreement is None:
            self.engine.submit(task.task_id, task.params)
        elif not self.agreement.add(task.task_id, task.created_idx, task) and self.agreement.was_cancelled(task.task_id):
            self.end_cancelled(task.task_id)

    def end_cancelled(self, task_id: str) -> None:
        """End a task cancelled by agreement before it started here."""
        if self.emits_chunks:
            self.send(ChunkMsg(FinishChunk(task_id=task_id, finish_reason="cancelled", prompt_tokens=0, completion_tokens=0)))
        self.send(TaskStatusMsg(task_id, "cancelled"))

    def note_stats(self, force: bool = False) -> None:
        """The engine's figures for the next heartbeat (``worker.runner.stats``), when due;
        rank 0's prefix digests when they changed (sent before the step's chunks, so the
        master knows them before the request's client does)."""
        if self.engine is None:
            return
        if self.stats_clock.due(force):
            self.pulse.stats = engine_stats(self.engine, self.kv_bytes_per_token, self.generated)
        if self.emits_chunks and self.engine.prompt_cache.enabled:
            digests = self.prefixes.offer(self.engine.prompt_cache.digests()) if force else self.prefixes.flush()
            if digests is not None:
                self.send(PrefixesMsg(digests))

    def step_generation(self) -> None:
        """One engine step (a prefill chunk or a decode step of the batch) as one ``step`` unit
        of work, its chunks and task statuses sent."""
        assert self.engine is not None
        if not isinstance(self.status, RunnerRunning):
            self.set_status(RunnerRunning())
        with self.pulse.unit("step"):
            self.faults.before_step()
            if not self.multi:  # a multi-rank runner's ranks agree it in their rounds (rounds.py)
                self.engine.slots.hold_long = self.pacer.hold
            started = time.monotonic()
            chunks = self.engine.step()
        self.pacer.note(time.monotonic() - started, self.engine.slots.long_fed, bool(self.engine.batch.rows))
        self.generated += sum(1 for c in chunks if isinstance(c, TokenChunk) and c.token_id is not None)
        self.note_stats(force=any(isinstance(c, (FinishChunk, ErrorChunk)) for c in chunks))
        for chunk in chunks:
            if chunk.task_id not in self.running_tasks and not isinstance(chunk, (FinishChunk, ErrorChunk)):
                self.running_tasks.add(chunk.task_id)
                self.send(TaskStatusMsg(chunk.task_id, "running"))
            if self.emits_chunks:
                self.send(ChunkMsg(chunk))
            if isinstance(chunk, (FinishChunk, ErrorChunk)) and self.agreement is not None:
                self.agreement.finished(chunk.task_id)
            if isinstance(chunk, FinishChunk):
                self.running_tasks.discard(chunk.task_id)
                self.send(TaskStatusMsg(chunk.task_id, "cancelled" if chunk.finish_reason == "cancelled" else "complete"))
            elif isinstance(chunk, ErrorChunk):
                self.running_tasks.discard(chunk.task_id)
                self.send(TaskStatusMsg(chunk.task_id, "failed"))
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
    if runner.group is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # do not wait on the ring's sockets (a peer may be gone)
    return code


if __name__ == "__main__":
    sys.exit(main())
