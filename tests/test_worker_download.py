"""The worker fetches a shard its node lacks before it starts the runner (docs/models.md): the
runner is Downloading meanwhile, a deleted instance cancels the fetch, a failed fetch fails
the runner with the reason. A fake fetch; no runner process is started."""

from __future__ import annotations

import pytest
import trio

from exo_p2p.models.errors import ModelNotFoundError
from exo_p2p.types import Instance, RunnerDownloading, RunnerFailed, RunnerShutdown, RunnerStatusUpdated, ShardMetadata, State
from worker.worker import Worker

NODE, BOOT = "node-a", "boot-1"


def _instance() -> Instance:
    shard = ShardMetadata(NODE, "i1-r0", 0, 1, 0, 4, 4, 100, BOOT)
    return Instance("i1", "m", "pipeline", (shard,), model_digest="d" * 64)


def _missing(model_id: str):
    raise ModelNotFoundError(f"model {model_id!r} is not on this node")


def _statuses(events: list) -> list:
    return [e.status for e in events if isinstance(e, RunnerStatusUpdated)]


async def _until(predicate, timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


def _run_until_status(state: State, fetch, kinds: tuple, timeout: float = 5.0) -> list:
    """Run a worker over the fixed ``state`` with ``fetch`` until it emits a runner status
    of one of ``kinds``; the statuses it emitted."""
    events: list = []

    async def main() -> None:
        worker = Worker(NODE, BOOT, lambda: state, events.append, lambda c: None, _missing, fetch_shard=fetch)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            await _until(lambda: any(isinstance(s, kinds) for s in _statuses(events)), timeout)
            nursery.cancel_scope.cancel()

    trio.run(main)
    return _statuses(events)


def test_deleting_the_instance_cancels_the_download() -> None:
    async def main() -> None:
        state = {"s": State(instances={"i1": _instance()})}
        events: list = []
        cancelled = trio.Event()

        async def fetch(instance, shard, progress):
            progress(0, 10)
            progress(5, 10)
            try:
                await trio.sleep_forever()
            finally:
                cancelled.set()

        worker = Worker(NODE, BOOT, lambda: state["s"], events.append, lambda c: None, _missing, fetch_shard=fetch)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            await _until(lambda: any(isinstance(s, RunnerDownloading) and s.bytes_total == 10 for s in _statuses(events)))
            assert worker.supervisors == {}  # no runner process while downloading
            assert isinstance(worker.local_runners()["i1-r0"].status, RunnerDownloading)
            # reports in between are sent at most every DOWNLOAD_STATUS_INTERVAL: 5/10 came too soon
            assert [s.bytes_done for s in _statuses(events)] == [0, 0]
            state["s"] = State()
            worker.wake()
            with trio.fail_after(5):
                await cancelled.wait()
            await _until(lambda: isinstance(_statuses(events)[-1], RunnerShutdown))
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_failed_fetch_fails_the_runner_with_the_reason() -> None:
    async def fetch(instance, shard, progress):
        raise RuntimeError("3 chunks of m could not be fetched (holders a: gone)")

    statuses = _run_until_status(State(instances={"i1": _instance()}), fetch, (RunnerFailed,))
    failed = next(s for s in statuses if isinstance(s, RunnerFailed))
    assert "cannot fetch the shard of model 'm'" in failed.error and "could not be fetched" in failed.error
    assert isinstance(statuses[0], RunnerDownloading)


def test_without_a_manifest_digest_the_missing_model_fails_as_before() -> None:
    async def main() -> None:
        inst = _instance()
        import msgspec

        state = State(instances={"i1": msgspec.structs.replace(inst, model_digest="")})
        events: list = []

        async def fetch(instance, shard, progress):  # never called
            raise AssertionError("fetched without a digest")

        worker = Worker(NODE, BOOT, lambda: state, events.append, lambda c: None, _missing, fetch_shard=fetch)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            await _until(lambda: any(isinstance(s, RunnerFailed) for s in _statuses(events)))
            nursery.cancel_scope.cancel()
        assert "cannot prepare model 'm'" in _statuses(events)[-1].error

    trio.run(main)


@pytest.mark.integration
def test_a_task_planned_while_the_fetched_runner_starts_waits_for_its_process(tmp_path, monkeypatch) -> None:
    """A runner created after a fetch is Idle (so the planner sends it ``LoadModel``) while
    its process is still being started: the task waits for the process and its setup, and
    the runner loads (it used to fail the runner: "internal error executing a task",
    AssertionError on the missing pipe, under load)."""
    from tests.support.models.synthetic_models import make_synthetic_model
    from exo_p2p.types import RunnerLoaded
    from worker.supervisor import RunnerSupervisor

    model_dir = tmp_path / "m"
    make_synthetic_model(model_dir, n_layers=4)
    start = RunnerSupervisor._start_process

    async def slow_start(self, output_fd):  # the process start of a loaded machine
        await trio.sleep(0.5)
        await start(self, output_fd)

    monkeypatch.setattr(RunnerSupervisor, "_start_process", slow_start)

    shard = ShardMetadata(NODE, "i1-r0", 0, 1, 0, 4, 4, 100, BOOT)
    state = State(instances={"i1": Instance("i1", "m", "pipeline", (shard,), model_digest="d" * 64)})

    async def fetch(instance, shard, progress):
        progress(10, 10)
        return model_dir

    # State is fixed here (events are not applied), so the planner's last task is LoadModel
    statuses = _run_until_status(state, fetch, (RunnerLoaded, RunnerFailed), timeout=60)
    failed = [s for s in statuses if isinstance(s, RunnerFailed)]
    assert not failed, failed
    assert any(isinstance(s, RunnerLoaded) for s in statuses)
