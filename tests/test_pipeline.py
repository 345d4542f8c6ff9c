"""Pipeline inference over the MLX ring on 127.0.0.1 (worker/engine/pipeline.py,
distributed.py) and the multi-rank runner (worker/runner/main.py).

Rank processes are real subprocesses on free loopback ports: greedy output of 2 and 3 ranks
equals 1 rank token for token (one prompt prefilled in several chunks); each rank's peak
memory during load is within ±15% of its share; a missing host list fails with the sizes;
a cancel that reaches one rank only stops every rank at the same step. Every process is
killed at the end of its test; every wait is bounded.

Run a rank by hand: ``python -m tests.test_pipeline '<json config>'`` (see ``rank_main``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.support.cluster import free_ports  # noqa: E402
from tests.support.ranks import child_main, ring_barrier, ring_wait_for, run_rank_processes  # noqa: E402
from tests.support.runners import CHUNK, ROOT, bring_up, cancel_bound, gen_task, layer_split, model_dir, start_runners, wait_for

PROMPTS = [
    "hello",
    "What is the capital of France?",
    "and the cat sat on the mat, " * 10,  # ~100 tokens: several prefill chunks of 16
    "héllo wörld 日本語 🙂",
]
MAX_TOKENS = 24
RANK_TIMEOUT = 120.0


# --- the rank child ------------------------------------------------------------------------

def rank_main(cfg: dict[str, Any]) -> dict[str, Any]:
    """One rank: join the ring (world_size > 1), load layers ``[start, end)``, run every
    prompt greedily; returns tokens per prompt, the text (rank 0), and load peak memory."""
    import mlx.core as mx

    from exo_p2p.types.chunks import ErrorChunk, FinishChunk, TokenChunk
    from exo_p2p.types.engine import EngineSettings
    from exo_p2p.types.tasks import ChatMessage, GenerationParams
    from worker.engine.builder import build_engine
    from worker.engine.distributed import init_ring
    from worker.engine.loading.loader import load_all
    from worker.engine.pipeline import PipelineStage, probe_hidden_dtype

    world, rank = cfg["world_size"], cfg["rank"]
    group = None
    if world > 1:
        group = init_ring(cfg.get("addresses"), rank, world, timeout=cfg.get("connect_timeout", 45.0))
    weights = cfg.get("weights") or ["stored"] * world
    loaded = load_all(cfg["model_dir"], start_layer=cfg["start"], end_layer=cfg["end"], weights_dtype=weights[rank])
    stage = None
    if group is not None:
        hidden = int(loaded.config["hidden_size"])
        wait = ring_wait_for(cfg.get("addresses"), rank)  # as the runner: waiting ranks sleep
        if "float32" in weights:  # as the runner: one dtype between ranks whose weights differ
            stage = PipelineStage(group, hidden, mx.float32, wire_dtype=mx.float32, wait=wait)
        else:
            stage = PipelineStage(group, hidden, probe_hidden_dtype(loaded.model, group, hidden), wait=wait)
    tokens: dict[str, list[int]] = {}
    # one request at a time (max_batch 1), every rank alike
    gen = build_engine(loaded, EngineSettings(prefill_chunk_size=cfg["chunk"], max_batch=1), stage=stage,
                       on_token=lambda t, tok: tokens.setdefault(t, []).append(tok))
    texts: dict[str, str] = {}
    finish: dict[str, list] = {}
    logprobs: dict[str, list] = {}
    for i, prompt in enumerate(cfg["prompts"]):  # odd prompts ask for logprobs (the last rank's travel to rank 0)
        gen.submit(f"p{i}", GenerationParams(messages=(ChatMessage("user", prompt),), max_tokens=cfg["max_tokens"],
                                             temperature=0.0, logprobs=3 if i % 2 else None))
    for _ in range(100_000):
        if not gen.has_work():
            break
        for chunk in gen.step():
            if isinstance(chunk, TokenChunk):
                texts[chunk.task_id] = texts.get(chunk.task_id, "") + chunk.text
                if chunk.logprobs is not None:
                    lp = chunk.logprobs
                    logprobs.setdefault(chunk.task_id, []).append(
                        [lp.chosen.token_id, lp.chosen.logprob, *[[t.token_id, t.logprob] for t in lp.top]])
            elif isinstance(chunk, FinishChunk):
                finish[chunk.task_id] = [chunk.finish_reason, chunk.completion_tokens]
            elif isinstance(chunk, ErrorChunk):
                finish[chunk.task_id] = ["error", chunk.error.message]
    if group is not None:  # no rank exits under a neighbour's collective (tests/support/ranks.py)
        ring_barrier(group)
    return {"rank": rank, "tokens": tokens, "texts": texts, "finish": finish, "logprobs": logprobs,
            "peak_memory_bytes": loaded.peak_memory_bytes, "active_memory": int(mx.get_active_memory())}


# --- helpers ------------------------------------------------------------------------------


def run_ranks(model_dir: Path, world: int, *, prompts=PROMPTS, chunk=CHUNK, max_tokens=MAX_TOKENS,
              n_layers: int = 4, drop_hostfile_rank: int | None = None,
              timeout: float = RANK_TIMEOUT, connect_timeout: float = 30.0,
              weights: list[str] | None = None) -> list[dict[str, Any]]:
    """Run ``world`` rank processes to completion; their results in rank order. ``weights``:
    per rank, ``"stored"`` or ``"float32"`` (default all stored). Raises ``AssertionError``
    with the stderr of a rank that failed or timed out."""
    addresses = [f"127.0.0.1:{p}" for p in free_ports(world)]
    cfgs = [{"model_dir": str(model_dir), "rank": rank, "world_size": world, "start": start,
             "end": end, "prompts": prompts, "chunk": chunk, "max_tokens": max_tokens,
             "addresses": None if rank == drop_hostfile_rank else addresses,
             "connect_timeout": connect_timeout, "weights": weights}
            for rank, (start, end) in enumerate(layer_split(n_layers, world))]
    return run_rank_processes("tests.test_pipeline", cfgs, timeout)


@pytest.fixture(scope="module")
def single(model_dir: Path) -> dict[str, Any]:
    return run_ranks(model_dir, 1)[0]


# --- greedy equality ----------------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.parametrize("world", [2, 3])
def test_pipeline_greedy_equals_single_rank(model_dir: Path, single: dict[str, Any], world: int) -> None:
    results = run_ranks(model_dir, world)
    assert len(single["tokens"]) == len(PROMPTS)
    for i in range(len(PROMPTS)):
        want = single["tokens"][f"p{i}"]
        assert len(want) >= 2
        for r in results:  # every rank saw the same tokens, equal to one rank's
            assert r["tokens"][f"p{i}"] == want, (world, r["rank"], i)
            assert r["finish"][f"p{i}"] == single["finish"][f"p{i}"]
        assert results[0]["texts"].get(f"p{i}", "") == single["texts"].get(f"p{i}", "")
        got, expected = results[0]["logprobs"].get(f"p{i}"), single["logprobs"].get(f"p{i}")
        assert (got is None) == (expected is None) == (i % 2 == 0), i  # rank 0 emits the last rank's values
        for g, w in zip(got or [], expected or [], strict=True):
            assert g[0] == w[0] and abs(g[1] - w[1]) <= 1e-4 and [t[0] for t in g[2:]] == [t[0] for t in w[2:]]


# --- per-rank memory ----------------------------------------------------------------------

def share_bytes(model_dir: Path, start: int, end: int, n_layers: int) -> int:
    """Bytes of the tensors a rank of layers ``[start, end)`` loads: its layers, the
    embedding on the first (and, tied, on the last), the final norm on the last."""
    import mlx.core as mx

    weights = mx.load(str(model_dir / "model.safetensors"))
    total = 0
    for name, arr in weights.items():
        if name.startswith("model.layers."):
            keep = start <= int(name.split(".")[2]) < end
        elif "embed_tokens" in name:
            keep = start == 0 or end == n_layers
        else:  # model.norm, lm_head
            keep = end == n_layers
        total += arr.nbytes if keep else 0
    return total


@pytest.mark.integration
def test_rank_peak_memory_is_its_share(tmp_path: Path) -> None:
    from tests.support.models.synthetic_models import make_synthetic_model

    big = make_synthetic_model(tmp_path / "big", n_layers=6, hidden_size=256, num_attention_heads=8,
                               num_key_value_heads=4, intermediate_size=1024)
    results = run_ranks(big, 3, prompts=["hi"], max_tokens=2, n_layers=6)
    full = share_bytes(big, 0, 6, 6)
    for r, (start, end) in zip(results, layer_split(6, 3), strict=True):
        share = share_bytes(big, start, end, 6)
        assert share < 0.5 * full
        assert abs(r["peak_memory_bytes"] - share) <= 0.15 * share, (r["rank"], r["peak_memory_bytes"], share)


# --- group size --------------------------------------------------------------------------

@pytest.mark.integration
def test_missing_host_list_fails_with_sizes(model_dir: Path) -> None:
    """Rank 1 has no host list: the ring would be a group of one; it must fail, naming the
    sizes (rank 0 then fails to connect within its bounded wait)."""
    with pytest.raises(AssertionError) as info:
        run_ranks(model_dir, 2, prompts=["hi"], max_tokens=2, drop_hostfile_rank=1, timeout=60,
                 connect_timeout=5.0)
    message = str(info.value)
    assert "rank 1 failed" in message and "expected world size 2, got 1" in message
    assert "rank 0 failed" in message and "timed out after 5 s" in message  # bounded, no hang


@pytest.mark.integration
def test_init_ring_is_bounded_when_alone() -> None:
    """Rank 0 of 2 whose peer never comes: the watchdog reports and kills it after 2 s."""
    port0, port1 = free_ports(2)
    code = (
        "from worker.engine.distributed import init_ring\n"
        f"init_ring(['127.0.0.1:{port0}', '127.0.0.1:{port1}'], 0, 2, timeout=2.0)\n"
        "print('RETURNED')\n"
    )
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == -9 and "RETURNED" not in p.stdout
    assert "ring init of rank 0/2 timed out after 2 s" in p.stderr and str(port1) in p.stderr
    assert time.monotonic() - t0 < 30


def test_hostfile_entries_rejects_missing_address() -> None:
    from worker.engine.distributed import hostfile_entries

    assert hostfile_entries(["127.0.0.1:1", "10.0.0.2:2"]) == [["127.0.0.1:1"], ["10.0.0.2:2"]]
    with pytest.raises(ValueError, match="rank 1"):
        hostfile_entries(["127.0.0.1:1", ""])


# --- the multi-rank runner (worker/runner/main.py) -----------------------------------------


@pytest.mark.integration
def test_runner_ranks_agree_on_tasks_and_cancel(model_dir: Path, single: dict[str, Any]) -> None:
    """Two runner ranks: tasks delivered in different orders run once, in created_idx order,
    with rank 0's text equal to one rank's; a cancel delivered to rank 1 only ends the task
    Cancelled on both ranks at the same step; Shutdown reaching one rank stops both."""
    from exo_p2p.types.chunks import FinishChunk, TokenChunk
    from exo_p2p.types.tasks import CancelTask, Shutdown

    runners = start_runners(model_dir, 2)
    try:
        bring_up(runners)
        a, b = gen_task("ta", 10, PROMPTS[0], MAX_TOKENS), gen_task("tb", 11, PROMPTS[1], MAX_TOKENS)
        runners[0].send(a)
        runners[0].send(b)
        runners[1].send(b)
        time.sleep(0.5)  # rank 1 lacks "ta": nothing may start before it arrives... except tb
        runners[1].send(a)
        for t in ("ta", "tb"):
            wait_for(lambda t=t: all("complete" in r.task_status(t) for r in runners), 60, f"{t} complete")
        single_text = {"ta": single["texts"]["p0"], "tb": single["texts"]["p1"]}
        for t in ("ta", "tb"):
            text = "".join(c.text for c in runners[0].chunks(t) if isinstance(c, TokenChunk))
            assert text == single_text[t]
            assert runners[1].chunks(t) == []  # rank 0 alone emits chunks
        # a long request, cancelled on rank 1 only
        long = gen_task("tc", 12, PROMPTS[2], 400)
        for r in runners:
            r.send(long)
        bound = cancel_bound(runners[0], "tc")  # 5 s, or more if this run decodes slowly
        runners[1].send(CancelTask(runner_id="x", task_id="tc"))
        wait_for(lambda: all("cancelled" in r.task_status("tc") for r in runners), bound, "tc cancelled on both")
        finish = [c for c in runners[0].chunks("tc") if isinstance(c, FinishChunk)]
        assert len(finish) == 1 and finish[0].finish_reason == "cancelled"
        assert 0 < finish[0].completion_tokens < 400
        # a task cancelled before it reached rank 1 is never started there
        runners[0].send(gen_task("td", 13, "hello", 50))
        runners[0].send(CancelTask(runner_id="x", task_id="td"))
        wait_for(lambda: "cancelled" in runners[0].task_status("td"), 10, "td cancelled on rank 0")
        runners[1].send(gen_task("td", 13, "hello", 50))
        wait_for(lambda: "cancelled" in runners[1].task_status("td"), 10, "td cancelled on rank 1")
        assert "running" not in runners[1].task_status("td")
        runners[1].send(Shutdown(runner_id="x"))
        for r in runners:
            r.proc.wait(timeout=15)
            assert r.proc.returncode == 0 and "shutdown" in r.statuses()
    finally:
        for r in runners:
            r.close()


@pytest.mark.integration
def test_runner_without_host_list_fails_connecting(model_dir: Path) -> None:
    """Group size at the runner: rank 1 without the host list fails while Connecting with the
    sizes; rank 0 never reaches Ready."""
    runners = start_runners(model_dir, 2, hooks={1: {"ring": "no_hostfile"}})
    try:
        wait_for(lambda: "failed" in runners[1].statuses(), 30, "rank 1 failed")
        failed = [m.status for m in runners[1].messages if type(getattr(m, "status", None)).__name__ == "RunnerFailed"]
        assert "expected world size 2, got 1" in failed[0].error
        assert "connecting" in runners[1].statuses()
        assert "ready" not in runners[0].statuses() and "connected" not in runners[0].statuses()
    finally:
        for r in runners:
            r.close()


if __name__ == "__main__":
    child_main(rank_main)


# --- ranks holding different weights (float32 next to stored float16) --------------------

@pytest.fixture(scope="module")
def half_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4-bit synthetic model with float16 scales: stored ranks compute in float16."""
    from tests.support.models.synthetic_models import make_synthetic_model

    return make_synthetic_model(tmp_path_factory.mktemp("half") / "synthetic", n_layers=4, quantize=True, dtype="float16")


@pytest.mark.integration
@pytest.mark.parametrize("weights", [["float32", "stored"], ["stored", "float32", "float32"]], ids=["f32-stored", "stored-f32-f32"])
def test_pipeline_ranks_with_different_weights(half_dir: Path, weights: list[str]) -> None:
    """A pipeline whose ranks hold different weights runs, every rank ends each step with the
    same token, and the text follows one rank's (greedy tokens of the first steps equal a
    single float32 rank's; later ones may differ where float16 rounding flips a near tie)."""
    want = run_ranks(half_dir, 1, weights=["float32"])[0]
    results = run_ranks(half_dir, len(weights), weights=weights)
    for i in range(len(PROMPTS)):
        tokens = results[0]["tokens"][f"p{i}"]
        assert all(r["tokens"][f"p{i}"] == tokens for r in results), i
        assert results[0]["finish"][f"p{i}"][0] == want["finish"][f"p{i}"][0]
        assert tokens[:8] == want["tokens"][f"p{i}"][:8], i
