"""Micro-batches (worker/engine/micro.py): a decode batch split so a pipeline's ranks compute
at once, with every request's output still its output alone.

In process (the whole model, ``LocalStage``): 12 requests (greedy, seeded, stop strings, a
regex format) in 2 and 3 micro-batches equal each request alone token for token, with every
micro-batch holding rows at once, and a row cancelled in one micro-batch leaves the others
unchanged. The count's rules (pure, hypothesis) and the builder's agreement across ranks.
Across 2 and 3 pipeline rank processes on 127.0.0.1 (the real ``PipelineStage`` and ring):
the same 12 requests in 2 micro-batches equal each alone; and two runner ranks (agreement
rounds, a cancel on one rank) with ``micro_batches`` 2.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.support.models.synthetic_models import make_synthetic_model  # noqa: E402
from exo_p2p.types.engine import EngineSettings  # noqa: E402
from tests.support.batch_drive import CHUNK, drive, requests  # noqa: E402
from worker.engine.loading.loader import LoadedModel, load_all  # noqa: E402
from worker.engine.micro import (MAX_MICRO_BATCHES, MicroBatches, auto_micro_batches,  # noqa: E402
                                 decode_batch, resolve_micro_batches)
from worker.engine.scheduler import Engine  # noqa: E402

N_LAYERS = 4


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_all(make_synthetic_model(tmp_path_factory.mktemp("micro") / "synthetic", n_layers=N_LAYERS))


@pytest.fixture(scope="module")
def solo(loaded: LoadedModel) -> dict[str, dict[str, Any]]:
    """Each request alone (``max_batch`` 1, no micro-batches)."""
    out = {}
    for task_id, params in requests():
        gen = Engine(loaded, EngineSettings(prefill_chunk_size=CHUNK, max_batch=1))
        gen.submit(task_id, params)
        out[task_id] = drive(gen)
    return out


def micro_engine(loaded: LoadedModel, count: int) -> Engine:
    gen = Engine(loaded, EngineSettings(prefill_chunk_size=CHUNK, max_batch=16, micro_batches=count))
    assert isinstance(gen.batch, MicroBatches) and len(gen.batch.parts) == count
    return gen


def busiest_split(gen: Engine) -> list[int]:
    """Rows per micro-batch now (``drive`` is stepped by hand below to watch it)."""
    assert isinstance(gen.batch, MicroBatches)
    return [len(part.rows) for part in gen.batch.parts]


def drive_watching(gen: Engine, **kw: Any) -> tuple[dict[str, Any], int]:
    """``drive(gen)``, and the most rows the least-filled micro-batch held at one step."""
    least = 0
    step = gen.step

    def watched() -> list:
        nonlocal least
        out = step()
        least = max(least, min(busiest_split(gen)))
        return out

    gen.step = watched  # type: ignore[method-assign]
    return drive(gen, **kw), least


@pytest.mark.parametrize("count", [2, 3])
def test_micro_batches_equal_solo(loaded: LoadedModel, solo: dict[str, dict[str, Any]], count: int) -> None:
    gen = micro_engine(loaded, count)
    for task_id, params in requests():
        gen.submit(task_id, params)
    out, least = drive_watching(gen)
    assert least >= 2, "every micro-batch held rows at one step"
    for task_id, _ in requests():
        assert out["ids"][task_id] == solo[task_id]["ids"][task_id], task_id
        assert out["texts"].get(task_id, "") == solo[task_id]["texts"].get(task_id, ""), task_id
        assert out["finish"][task_id] == solo[task_id]["finish"][task_id], task_id
    assert not gen.batch.holds_kv and gen.batch_size == 0  # every KV row freed


def test_cancelled_row_leaves_its_micro_batch(loaded: LoadedModel, solo: dict[str, dict[str, Any]]) -> None:
    gen = micro_engine(loaded, 2)
    for task_id, params in requests():
        gen.submit(task_id, params)
    out, _ = drive_watching(gen, cancel_after={"t7": 3})
    assert out["finish"]["t7"][0] == "cancelled"
    for task_id, _ in requests():
        if task_id != "t7":
            assert out["ids"][task_id] == solo[task_id]["ids"][task_id], task_id
    assert not gen.batch.holds_kv


@given(sharding=st.sampled_from(["pipeline", "tensor", None]), world=st.integers(1, 12), hosts=st.integers(0, 12))
def test_auto_micro_batches_only_for_pipelines_on_their_own_hosts(sharding: str | None, world: int, hosts: int) -> None:
    n = auto_micro_batches(sharding, world, hosts)
    own_hosts = sharding == "pipeline" and world >= 2 and hosts >= world
    assert n == (min(world, MAX_MICRO_BATCHES) if own_hosts else 1)


@given(setting=st.integers(0, 40), max_batch=st.integers(1, 40), auto=st.integers(1, 12))
def test_resolved_micro_batches_stay_within_the_batch(setting: int, max_batch: int, auto: int) -> None:
    n = resolve_micro_batches(EngineSettings(max_batch=max_batch, micro_batches=setting), auto)
    assert 1 <= n <= min(max_batch, MAX_MICRO_BATCHES)
    assert n == max(1, min(setting if setting else auto, max_batch, MAX_MICRO_BATCHES))


def test_decode_batch_is_one_batch_unless_split() -> None:
    assert not isinstance(decode_batch(EngineSettings(max_batch=4)), MicroBatches)
    assert not isinstance(decode_batch(EngineSettings(max_batch=4, micro_batches=1)), MicroBatches)
    assert len(decode_batch(EngineSettings(max_batch=4, micro_batches=3)).parts) == 3  # type: ignore[union-attr]
    assert not isinstance(decode_batch(EngineSettings(max_batch=1, micro_batches=2)), MicroBatches)
    assert len(decode_batch(EngineSettings(max_batch=64, micro_batches=40)).parts) == MAX_MICRO_BATCHES  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        MicroBatches(4, 1)
    with pytest.raises(ValueError):
        MicroBatches(2, 3)
    with pytest.raises(ValueError):
        EngineSettings(micro_batches=-1).check()


def test_ranks_agree_the_smallest_micro_batches() -> None:
    """Every rank proposes its count (setting or rule) and keeps the smallest (one all-gather)."""
    from worker.engine.builder import Ring, agree_limits, micro_proposal

    class Group:
        def size(self) -> int:
            return 2

    proposals = [micro_proposal(EngineSettings(max_batch=16, micro_batches=m), Ring(Group(), "pipeline", False, None, hosts=h), None)
                 for m, h in ((0, 2), (0, 1), (3, 1), (0, 0))]
    assert proposals == [2, 1, 3, 1]
    rows = np.array([[100, 5, 2], [50, 7, 3]], dtype=np.int64)
    assert agree_limits(lambda row: rows, 100, 5, 2) == (50, 5, 2)
    assert micro_proposal(EngineSettings(micro_batches=2), None, None) == 1  # the whole model on one rank: never
    assert micro_proposal(EngineSettings(micro_batches=2), Ring(Group(), "tensor", False, None, hosts=2), None) == 1


# --- across rank processes ------------------------------------------------------------------

def rank_main(cfg: dict[str, Any]) -> dict[str, Any]:
    """One pipeline rank: the 12 requests at once in ``cfg["micro"]`` micro-batches; returns
    each request's tokens and the most rows the least-filled micro-batch held at one step."""
    from worker.engine.builder import build_engine
    from worker.engine.distributed import init_ring
    from worker.engine.pipeline import PipelineStage, probe_hidden_dtype
    from tests.support.ranks import ring_barrier, ring_wait_for

    group = init_ring(cfg["addresses"], cfg["rank"], cfg["world_size"], timeout=30.0)
    loaded = load_all(cfg["model_dir"], start_layer=cfg["start"], end_layer=cfg["end"])
    hidden = int(loaded.config["hidden_size"])
    stage = PipelineStage(group, hidden, probe_hidden_dtype(loaded.model, group, hidden),
                          wait=ring_wait_for(cfg["addresses"], cfg["rank"]))
    gen = build_engine(loaded, EngineSettings(prefill_chunk_size=CHUNK, max_batch=16, micro_batches=cfg["micro"]),
                       stage=stage)
    assert isinstance(gen.batch, MicroBatches) == (cfg["micro"] > 1)
    assert stage.wait.active == (cfg["micro"] == 1)  # engine.ring_wait
    for task_id, params in requests():
        gen.submit(task_id, params)
    out, least = drive_watching(gen) if cfg["micro"] > 1 else (drive(gen), 0)
    ring_barrier(group)  # no rank exits under a neighbour's collective (tests/support/ranks.py)
    finish = {t: list(f) for t, f in out["finish"].items()}
    return {"rank": cfg["rank"], "ids": out["ids"], "finish": finish, "least": least, "timeouts": stage.wait.timeouts}


@pytest.mark.integration
@pytest.mark.parametrize("world,micro", [(2, 2), (3, 2), (2, 1), (3, 1)])
def test_pipeline_micro_batches_equal_solo(loaded: LoadedModel, solo: dict[str, dict[str, Any]], world: int,
                                           micro: int) -> None:
    """``micro`` 1: one batch of up to 12 rows, its ranks waiting asleep (``ring_wait``), no
    wait running out of patience: as the batch shrinks from 12 rows to 1, every all-sum of the
    tokens wakes the rank it should (on 3 ranks, 4 rows left one ring segment empty)."""
    from tests.support.cluster import free_ports
    from tests.support.ranks import run_rank_processes
    from tests.support.runners import layer_split

    addresses = [f"127.0.0.1:{p}" for p in free_ports(world)]
    cfgs = [{"model_dir": str(loaded.model_dir), "rank": r, "world_size": world, "start": s, "end": e,
             "addresses": addresses, "micro": micro} for r, (s, e) in enumerate(layer_split(N_LAYERS, world))]
    results = run_rank_processes("tests.test_micro", cfgs, timeout=240.0)
    for res in results:
        assert micro == 1 or res["least"] >= 2, f"rank {res['rank']}: every micro-batch held rows at one step"
        assert res["timeouts"] == 0, f"rank {res['rank']}: {res['timeouts']} waits ran out of patience"
        for task_id, _ in requests():
            assert res["ids"][task_id] == solo[task_id]["ids"][task_id], (res["rank"], task_id)
            assert res["finish"][task_id] == list(solo[task_id]["finish"][task_id]), (res["rank"], task_id)


if __name__ == "__main__":
    from tests.support.ranks import child_main

    child_main(rank_main)
