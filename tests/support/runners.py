"""Runner processes of a pipeline on loopback: start, bring up, drive and shut down (the
harness of the pipeline, batch and tensor tests).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import free_ports


os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[2]
CHUNK = 16


def layer_split(n_layers: int, world: int) -> list[tuple[int, int]]:
    """Contiguous ranges, as even as possible, earlier ranks taking the remainder."""
    base, extra = divmod(n_layers, world)
    out, start = [], 0
    for r in range(world):
        end = start + base + (1 if r < extra else 0)
        out.append((start, end))
        start = end
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.models.synthetic_models import make_synthetic_model

    return make_synthetic_model(tmp_path_factory.mktemp("pipe") / "synthetic", n_layers=4)


class RunnerProc:
    """One runner subprocess driven over its two pipes, as the supervisor does."""

    def __init__(self, setup: Any) -> None:
        from worker.runner.protocol import frame

        to_r, self._in_w = os.pipe()
        self._out_r, from_r = os.pipe()
        # stderr to an unlinked file, never an undrained pipe (a full pipe blocks the runner)
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "worker.runner.main", "--in-fd", str(to_r), "--out-fd", str(from_r)],
            cwd=ROOT, pass_fds=(to_r, from_r), stdout=subprocess.DEVNULL, stderr=self.stderr,
            env={**os.environ, "HF_HUB_OFFLINE": "1"})
        os.close(to_r)
        os.close(from_r)
        self.messages: list[Any] = []
        self._frame = frame
        self.send(setup)
        import threading

        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        from worker.runner.protocol import read_frame, to_supervisor_decoder

        while True:
            try:
                payload = read_frame(self._out_r)
            except (OSError, ValueError):
                return
            if payload is None:
                return
            self.messages.append(to_supervisor_decoder.decode(payload))

    def send(self, message: Any) -> None:
        from worker.runner.protocol import write_all

        write_all(self._in_w, self._frame(message))

    def statuses(self) -> list[str]:
        return [type(m.status).__struct_config__.tag for m in self.messages if hasattr(m, "status") and not isinstance(m.status, str)]

    def task_status(self, task_id: str) -> list[str]:
        return [m.status for m in self.messages if getattr(m, "task_id", None) == task_id]

    def chunks(self, task_id: str) -> list[Any]:
        return [m.chunk for m in self.messages if hasattr(m, "chunk") and m.chunk.task_id == task_id]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.stderr.close()
        for fd in (self._in_w, self._out_r):
            try:
                os.close(fd)
            except OSError:
                pass


def shut_down_cleanly(runners: list[RunnerProc]) -> None:
    """Send ``Shutdown`` to rank 0 (it reaches every rank through the agreement) and assert
    every runner exits with code 0 within 15 s."""
    from exo_p2p.types.tasks import Shutdown

    runners[0].send(Shutdown(runner_id="x"))
    for r in runners:
        r.proc.wait(timeout=15)
        assert r.proc.returncode == 0


def wait_for(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def cancel_bound(rank0: Any, task_id: str, tokens: int = 8) -> float:
    """Seconds a cancel of ``task_id``, which is streaming from ``rank0``, may take to end it on
    every rank, scaled by this run's decode speed: waits for its first token, measures the time
    per token over ``tokens`` more, and allows ``tests.support.cancel_bounds.cancel_bound`` of that
    speed (its quiet bound, or the steps to the next agreement round on a slow host)."""
    from exo_p2p.types.chunks import TokenChunk
    from tests.support.cancel_bounds import cancel_bound as bound_at

    def count() -> int:
        return sum(1 for c in rank0.chunks(task_id) if isinstance(c, TokenChunk))

    wait_for(lambda: count() >= 1, 60, f"{task_id} tokens")
    t, n = time.monotonic(), count()
    wait_for(lambda: count() >= n + tokens, 60, f"{tokens} more {task_id} tokens")
    return bound_at((time.monotonic() - t) / (count() - n))


def make_instance(model_dir: Path, world: int, n_layers: int = 4):
    from exo_p2p.types.instances import Instance, ShardMetadata

    ports = free_ports(world)
    shards = tuple(
        ShardMetadata(node_id=f"n{r}", runner_id=f"r{r}", rank=r, world_size=world, start_layer=a,
                      end_layer=b, n_layers=n_layers, share_bytes=0, boot_id="b",
                      ring_address=f"127.0.0.1:{ports[r]}")
        for r, (a, b) in enumerate(layer_split(n_layers, world)))
    return Instance(instance_id="i1", model_id="synthetic", sharding="pipeline", shards=shards)


def start_runners(model_dir: Path, world: int, hooks: dict[int, dict[str, str]] | None = None,
                  max_batch: int = 1, micro_batches: int = 0, speculative: str = "off") -> list[RunnerProc]:
    from exo_p2p.types.tasks import ConnectToGroup
    from exo_p2p.types.engine import EngineSettings
    from worker.runner.protocol import RunnerSetup

    instance = make_instance(model_dir, world)
    runners = []
    for shard in instance.shards:
        runners.append(RunnerProc(RunnerSetup(instance=instance, shard=shard, model_dir=str(model_dir),
                                              heartbeat_interval=0.5,
                                              engine=EngineSettings(prefill_chunk_size=CHUNK, max_batch=max_batch,
                                                                    micro_batches=micro_batches, speculative=speculative),
                                              fault_hooks=(hooks or {}).get(shard.rank, {}))))
    for r in runners:
        r.send(ConnectToGroup(runner_id="x"))
    return runners


def bring_up(runners: list[RunnerProc]) -> None:
    from exo_p2p.types.tasks import LoadModel, StartWarmup

    wait_for(lambda: all("connected" in r.statuses() for r in runners), 60, "connected")
    for r in runners:
        r.send(LoadModel(runner_id="x"))
    wait_for(lambda: all("loaded" in r.statuses() for r in runners), 60, "loaded")
    for r in runners:
        r.send(StartWarmup(runner_id="x"))
    wait_for(lambda: all("ready" in r.statuses() for r in runners), 60, "ready")


def gen_task(task_id: str, created_idx: int, prompt: str, max_tokens: int):
    from exo_p2p.types.tasks import ChatMessage, GenerationParams, TextGeneration

    return TextGeneration(task_id=task_id, instance_id="i1", model_id="synthetic", api_node_id="n0",
                          created_idx=created_idx,
                          params=GenerationParams(messages=(ChatMessage("user", prompt),),
                                                  max_tokens=max_tokens, temperature=0.0))


def task_for_request(created_idx: int, req: Any):
    """The ``TextGeneration`` task a runner gets for engine request ``req``, a ``(task_id,
    GenerationParams)`` pair (what ``Engine.submit`` takes), on instance ``i1``."""
    from exo_p2p.types.tasks import TextGeneration

    task_id, params = req
    return TextGeneration(task_id=task_id, instance_id="i1", model_id="synthetic", api_node_id="n0",
                          created_idx=created_idx, params=params)


def tensor_runners(model_dir: Path, max_batch: int, speculative: str = "off") -> list[Any]:
    """Two tensor runner ranks of ``model_dir`` (4 layers) on instance ``i1``, connecting."""
    from exo_p2p.types.instances import Instance, ShardMetadata
    from exo_p2p.types.tasks import ConnectToGroup
    from exo_p2p.types.engine import EngineSettings
    from worker.runner.protocol import RunnerSetup

    ports = free_ports(2)
    shards = tuple(ShardMetadata(node_id=f"n{r}", runner_id=f"r{r}", rank=r, world_size=2, start_layer=0,
                                 end_layer=4, n_layers=4, share_bytes=0, boot_id="b",
                                 ring_address=f"127.0.0.1:{ports[r]}") for r in range(2))
    instance = Instance(instance_id="i1", model_id="synthetic", sharding="tensor", shards=shards)
    runners = [RunnerProc(RunnerSetup(instance=instance, shard=s, model_dir=str(model_dir), heartbeat_interval=0.5,
                                      engine=EngineSettings(prefill_chunk_size=CHUNK, max_batch=max_batch,
                                                           speculative=speculative))) for s in shards]
    for r in runners:
        r.send(ConnectToGroup(runner_id="x"))
    return runners


def deliver(runners: list[RunnerProc], tasks: list[Any]) -> None:
    """Send ``tasks`` to two runner ranks in opposite orders (the agreement rounds order them)."""
    for t in tasks:
        runners[0].send(t)
    for t in reversed(tasks):
        runners[1].send(t)
