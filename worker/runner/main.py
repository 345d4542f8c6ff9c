"""The runner process: holds one shard of one instance and runs it (docs/architecture.md#vocabulary).

Started by the worker's supervisor as ``python -m worker.runner.main --in-fd N --out-fd M``.
It reads ``RunnerSetup`` and then tasks from ``in-fd``, and writes status, chunks and
heartbeats to ``out-fd``. States: Idle → (Connecting → Connected, multi-rank only) →
Loading(layers) → Loaded → WarmingUp → Ready ⇄ Running → ShuttingDown → Shutdown,
Failed(error) from anywhere. It exits by itself when its node dies: end of file on ``in-fd``
(the node's end closed) or the parent-death signal.

Multi-rank instances: ``ConnectToGroup`` joins the MLX ring (``engine.distributed``,
bounded); ``LoadModel`` loads only this rank's share (pipeline: its layers; tensor: its
1/world_size of every layer, ``engine.tensor``); ``StartWarmup`` runs a warm-up
generation in lockstep on every rank and agrees how many decode steps may pass between
agreement rounds (``check_every``: ~``CHECK_SECONDS`` of decode). Once Ready, generation
tasks, cancels and Shutdown are not acted on directly but held by a ``TaskAgreement`` and
decided in rounds that every rank runs at the same points (before each request acceptance
and prefill chunk, every ``check_every`` decode steps, and every ``IDLE_ROUND_INTERVAL``
seconds when idle). Each round also re-agrees ``check_every`` from every rank's measured
decode rate (the smallest proposal), so a cancel is acted on within ~``CHECK_SECONDS`` of
decode even when the machine slows down after warm-up (tests/test_cancel.py). Every rank reports task status; rank 0 alone emits the chunks (every rank
holds the same tokens and tokenizer, so rank 0's text is the instance's text). Heartbeats
come from a thread of their own (``worker.runner.pulse``), however long a step computes, and
say which unit of work the main thread is in and for how long: a rank blocked in a collective
because a peer vanished reports one step that never ends, and its supervisor kills it as
stuck (``worker.liveness``); a collective that fails (a reset ring link: MLX fails the
pending work and that socket never works again) fails the runner at once
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
import numpy as np

from exo_p2p.types import (
    CancelTask,
    RunnerConnected,
    RunnerConnecting,
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
    TokenChunk,
)
from worker.runner.faults import NO_FAULTS, STAGE_LOADING, STAGE_WARMUP, RunnerFaults
from worker.runner.pulse import Pulse, start_heartbeat
from worker.runner.stats import PrefixPublisher, StatsClock, engine_stats
from worker.runner.protocol import (
    ChunkMsg,
    PrefixesMsg,
    RunnerSetup,
    StatusMsg,
    TaskStatusMsg,
    frame,
    read_frame,
    to_runner_decoder,
    write_all,
)

_EOF = object()

IDLE_ROUND_INTERVAL = 0.1
"""Seconds between agreement rounds while a multi-rank runner is idle (bounds how long a new
request waits before every rank has agreed on it, plus delivery skew)."""

CHECK_SECONDS = 1.0
"""Target seconds of decode between agreement rounds (docs/architecture.md#rules: a check at least every ~2 s;
1 s leaves room for decode slowing down between two rounds, and a round — one all-gather of
a few hundred bytes — costs about a millisecond)."""

MAX_CHECK_EVERY = 16
"""Most decode steps between agreement rounds, however fast decode is. Small because the pace
is measured on the last interval and decode can slow down ~10× at once when other processes
take the CPU: 64 steps measured at 100 tokens/s then took over 10 s (a cancel waited that
long). A round costs about one pipeline hop, so 1/16 of a step's communication."""


BATCH_CHECK_SECONDS = 0.25
"""``CHECK_SECONDS`` of an instance that batches (``max_batch`` > 1): a request arriving while
others decode joins only after the next round has agreed on it, so rounds come 4× as often
(measured on a 2-node pipeline, 8 streams decoding: a joining request's TTFT was 4.4× its
TTFT alone with rounds ~1 s apart; the target is ≤ 2×)."""


def round_seconds(max_batch: int) -> float:
    """Target seconds of decode between agreement rounds for an instance batching up to
    ``max_batch`` sequences."""
    return BATCH_CHECK_SECONDS if max_batch > 1 else CHECK_SECONDS


def check_every_for(decode_tokens_per_second: float, seconds: float = CHECK_SECONDS) -> int:
    """Decode steps between agreement rounds so a round comes every ``seconds`` at the
    measured rate (steps per second): ``1 ≤ n ≤ MAX_CHECK_EVERY``."""
    return max(1, min(MAX_CHECK_EVERY, int(seconds * decode_tokens_per_second)))


PRELOAD_MODULES = ("mlx.core", "worker.engine.loader", "worker.engine.builder")
"""What a runner imports in the background from its start: MLX, mlx-lm and transformers
take ~1 s of CPU to import (over 10 s on a loaded machine), time that would otherwise come
after the lifecycle barriers (every rank created, every rank connected) instead of during
them — a re-placed 2-node instance spent 11-13 s between Connected and Loading under
scripts/chaos.py. ``load`` imports the same modules; Python's import locks make it wait
for an import still in flight rather than run it twice."""


def _preload(modules: tuple[str, ...] = PRELOAD_MODULES) -> None:
    """Import ``modules`` (a failure is left for ``load`` to report, with its traceback)."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - reported by the lifecycle task that needs it
            return


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
        self.faults = RunnerFaults.from_hooks(first.fault_hooks) if first.fault_hooks else NO_FAULTS
        interval = first.heartbeat_interval
        start_heartbeat(self.pulse, self.send, interval)
        while True:
            if self.multi and isinstance(self.status, (RunnerReady, RunnerRunning)):
                try:
                    code = self.serve_round()
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
            if item is _EOF:
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
                self.connect(faults)
            return None
        if isinstance(task, LoadModel):
            self.load(faults)
            return None
        if isinstance(task, StartWarmup):
            self.set_status(RunnerWarmingUp())
            faults.at(STAGE_WARMUP)
            self.warmup()
            self.set_status(RunnerReady())
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
            self.set_status(RunnerShuttingDown())
            self.engine = None
            self.loaded = None
            self.set_status(RunnerShutdown())
            return "exit"
        if isinstance(task, CreateRunner):
            return None
        raise TypeError(f"unexpected task {type(task).__name__}")

    def connect(self, faults: RunnerFaults) -> None:
        """Join the instance's ring (bounded; see ``engine.distributed.init_ring``); test
        faults may drop the host list (``worker.runner.faults``)."""
        from worker.engine.distributed import init_ring

        assert self.setup is not None
        shard, instance = self.setup.shard, self.setup.instance
        if instance.sharding not in ("pipeline", "tensor"):
            raise RuntimeError(f"{instance.sharding} sharding is not supported by this runner")
        self.set_status(RunnerConnecting())
        addresses = faults.ring_addresses([s.ring_address for s in instance.shards])
        self.group = init_ring(
            addresses, shard.rank, shard.world_size,
            timeout_report=lambda m: (self.out_fd, frame(StatusMsg(RunnerFailed(m)))),
        )
        self.set_status(RunnerConnected())

    def load(self, faults: RunnerFaults) -> None:
        """Load this rank's layers, reporting ``RunnerLoading`` from the start (the imports of
        MLX and mlx-lm below take seconds on a busy machine: that is loading too)."""
        assert self.setup is not None
        shard = self.setup.shard
        total = shard.end_layer - shard.start_layer
        self.set_status(RunnerLoading(0, total))
        import mlx.core as mx

        from worker.engine.loader import LoadProgress, load_model

        faults.at(STAGE_LOADING)
        loaded = None
        tensor_group = self.group if self.multi and self.setup.instance.sharding == "tensor" else None
        for item in load_model(self.setup.model_dir, start_layer=shard.start_layer, end_layer=shard.end_layer,
                               tensor_group=tensor_group, weights_dtype=shard.weights_dtype):
            if isinstance(item, LoadProgress):
                self.pulse.progress()
                self.set_status(RunnerLoading(item.layers_loaded, item.layers_total))
            else:
                loaded = item
        assert loaded is not None
        self.loaded = loaded
        mx.synchronize()
        self.set_status(RunnerLoaded(peak_memory_bytes=int(getattr(loaded, "peak_memory_bytes", 0))))

    def warmup(self) -> None:
        """Build the engine (a collective on a multi-rank instance: its stage and limits are
        agreed, ``worker.engine.builder``), then generate a few tokens (greedy, discarded) so
        the first request does not pay for first-use costs; bounded by its ``max_tokens``. A
        model without a chat template is warmed up all the same (the error chunk is
        discarded). A multi-rank instance then agrees its pace (``check_every``)."""
        from exo_p2p.types.tasks import ChatMessage, GenerationParams
        from worker.engine.batch_memory import model_kv_bytes_per_token
        from worker.engine.builder import build_engine

        assert self.setup is not None and self.loaded is not None
        ring = self.make_ring() if self.multi else None
        self.engine = build_engine(self.loaded, self.setup.engine, model_id=self.setup.instance.model_id, ring=ring)
        if ring is not None and not ring.wait.active:  # ranks that compute at once, or spin as they wait
            from worker.runner.blas_threads import share_blas_threads

            shared = share_blas_threads([s.ring_address for s in self.setup.instance.shards], self.setup.shard.rank)
            if shared is not None:
                print(f"runner: {shared} BLAS thread(s): ranks of this instance share this host", file=sys.stderr, flush=True)
        self.engine.submit("warmup", GenerationParams(messages=(ChatMessage("user", "Hi"),), max_tokens=6, temperature=0.0))
        tps = 0.0
        for _ in range(1000):
            if not self.engine.has_work():
                break
            started = time.monotonic()
            for chunk in self.engine.step():
                if isinstance(chunk, FinishChunk):
                    tps = chunk.decode_tokens_per_second
            self.pulse.record(time.monotonic() - started, warmup=True)  # the stuck bound's history
            self.pulse.progress()
        self.kv_bytes_per_token = model_kv_bytes_per_token(self.loaded.model)
        cache = self.engine.prompt_cache  # the warm-up request is not traffic
        cache.hits = cache.misses = cache.reused_tokens = self.engine.prefilled_tokens = 0
        self.note_stats(force=True)
        if self.multi:  # the pace is the same on every rank: the slowest rank's
            assert self.all_gather is not None
            proposal = np.array([check_every_for(tps, round_seconds(self.setup.engine.max_batch))], dtype=np.int64)
            self.check_every = int(self.all_gather(proposal).min())

    def make_ring(self):
        """This rank's ``Ring`` (its all-gather is also the agreement's), and the
        ``TaskAgreement`` that holds tasks from now on. A pipeline rank waits for its
        neighbours asleep (``engine.ring_wait``) and keeps the node's BLAS threads; any other
        rank (tensor, micro-batches, or ring sockets not found) takes its share of them once
        the engine is built (``warmup``, ``blas_threads``)."""
        from worker.engine.agreement import TaskAgreement
        from worker.engine.builder import Ring
        from worker.engine.distributed import ring_all_gather
        from worker.engine.forward import generation_stream
        from worker.engine.ring_wait import pipeline_wait

        assert self.group is not None and self.setup is not None
        # one dtype between ranks: float32 when any rank holds float32 weights, else what the
        # stored weights compute in
        float32 = any(s.weights_dtype == "float32" for s in self.setup.instance.shards)
        wait = pipeline_wait(self.setup.instance, self.setup.shard.rank)
        self.all_gather = ring_all_gather(self.group, generation_stream, wait)
        self.agreement = TaskAgreement()
        hosts = len({s.ring_address.rpartition(":")[0] for s in self.setup.instance.shards})
        return Ring(self.group, self.setup.instance.sharding, float32, self.all_gather, hosts=hosts, wait=wait)

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

    def serve_round(self) -> int | None:
        """One turn of a serving multi-rank runner: take input, run an agreement round when
        this is an agreement point (identical on every rank), do one generation step.
        Returns an exit code, or None to go on."""
        assert self.engine is not None and self.agreement is not None and self.all_gather is not None
        busy = self.engine.has_work()
        deadline = time.monotonic() + (0.0 if busy else IDLE_ROUND_INTERVAL)
        while True:
            wait = deadline - time.monotonic()
            try:
                item = self.tasks.get(timeout=wait) if wait > 0 else self.tasks.get_nowait()
            except queue.Empty:
                break
            if item is _EOF:
                return 0
            code = self.handle_item(item)
            if code is not None:
                return code
        if not busy or self.engine.in_prefill or self.steps_since_round >= self.check_every:
            with self.pulse.unit("round"):
                code = self.agreement_round()
            if code is not None:
                return code
        if self.engine.has_work():
            decoding = not self.engine.in_prefill
            started = time.monotonic()
            self.step_generation()
            if decoding:
                self.decode_steps += 1
                self.decode_seconds += time.monotonic() - started
            self.steps_since_round += 1
        return None

    def agreement_round(self) -> int | None:
        """One agreement round (a collective): start, cancel and drop what every rank agreed;
        0 when the ranks agreed to shut down."""
        assert self.engine is not None and self.agreement is not None and self.all_gather is not None
        result = self.agreement.round(self.all_gather, self.pace_proposal())
        self.steps_since_round, self.decode_steps, self.decode_seconds = 0, 0, 0.0
        if result.check_every > 0:
            self.check_every = result.check_every
        for task in result.start:
            self.engine.submit(task.task_id, task.params)
        for task_id in result.cancel:
            self.engine.cancel(task_id)
        for task in result.dropped:
            self.end_cancelled(task.task_id)
        if result.shutdown:
            self.set_status(RunnerShuttingDown())
            self.engine = None
            self.loaded = None
            self.set_status(RunnerShutdown())
            return 0
        return None

    def pace_proposal(self) -> int:
        """Decode steps this rank proposes until the next round, from the decode steps it
        timed since the last round (0: none timed, no proposal)."""
        if self.decode_steps == 0 or self.decode_seconds <= 0:
            return 0
        assert self.setup is not None
        return check_every_for(self.decode_steps / self.decode_seconds, round_seconds(self.setup.engine.max_batch))

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
            chunks = self.engine.step()
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="exo-p2p-runner")
    parser.add_argument("--in-fd", type=int, required=True)
    parser.add_argument("--out-fd", type=int, required=True)
    args = parser.parse_args(argv)
    from exo_p2p.limits import guard_setrlimit
    from exo_p2p.logging import configure_runner_output

    guard_setrlimit()  # before the preload imports mlx-lm, which would lower the open-file limit (exo_p2p.limits)

    configure_runner_output()  # the node's log format for prints, warnings, tracebacks
    threading.Thread(target=_watch_parent, args=(os.getppid(),), name="parent-watch", daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the node decides when we stop
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    threading.Thread(target=_preload, name="preload", daemon=True).start()  # after the env above
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
