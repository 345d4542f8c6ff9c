"""Linux CPU nodes at BLAS speed: the runner really runs OpenBLAS, and placement
decides each rank's weights (float32 or stored) and counts the bytes the runner holds.

Real node processes on 127.0.0.1 with the embedded SmolLM2-135M (stored 4-bit: 98 MB;
float32: 538 MB): a node whose ``--memory-limit`` fits the stored weights but not float32
gets stored weights, one that fits float32 gets float32, and in both the ``share_bytes``
placement reserved is within ±15% of the runner's peak load memory (its "runner loaded" log
line). The runner's ``/proc/<pid>/maps`` lists the preloaded libopenblas and its
environment has ``OPENBLAS_NUM_THREADS``; a node without an optimised BLAS still serves and
warns once with the install command. Every process is stopped at the end of its test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.support.cluster import NodeProcess, wait_until
from worker import blas

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m-instruct"
ROOT = Path(__file__).resolve().parent.parent
OPENBLAS = blas.find_optimised_blas()
needs_openblas = pytest.mark.skipif(OPENBLAS is None, reason=f"no OpenBLAS installed ({blas.INSTALL_COMMAND})")


def _runner_processes(node: NodeProcess) -> list[psutil.Process]:
    return [p for p in node.children() if "worker.runner.main" in " ".join(p.cmdline())]


def _log_records(node: NodeProcess) -> list[dict]:
    out = []
    for line in node.log_path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _loaded_record(node: NodeProcess) -> dict:
    found = [r for r in _log_records(node) if r.get("event") == "runner loaded"]
    assert found, node.log_tail()
    return found[-1]


# --- the BLAS ------------------------------------------------------------------------------

_PROBE = """
import sys, time
import mlx.core as mx
a = mx.random.normal((384, 384)); b = mx.random.normal((384, 384)); mx.eval(a @ b)
best = 1e9
for _ in range(5):
    t = time.process_time(); [mx.eval(a @ b + i) for i in range(4)]; best = min(best, (time.process_time() - t) / 4)
print(2 * 384 ** 3 / best / 1e9)
"""


@needs_openblas
def test_preloaded_openblas_takes_over_matmuls() -> None:
    """The runner's environment (``blas.runner_environment``) makes MLX's float32 matmul run
    in OpenBLAS: at least 3× the GFLOP per CPU second of the same process without it (one
    BLAS thread; measured ~22×). CPU time, not wall time: beside other test workers a
    wall-clock ratio of two runs in turn measured the machine's load (9.4 vs 5.4 GFLOP/s once)."""
    plain = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env = blas.runner_environment(plain, OPENBLAS, 1)
    assert env["LD_PRELOAD"].split()[0] == str(OPENBLAS) and env["OPENBLAS_NUM_THREADS"]

    def gflops(environ: dict[str, str]) -> float:
        out = subprocess.run([sys.executable, "-c", _PROBE], env=environ, capture_output=True, text=True, timeout=120, check=True)
        return float(out.stdout.strip().splitlines()[-1])

    fast, slow = gflops(env), gflops(plain)
    print(f"\nfloat32 384x384 matmul: {fast:.1f} GFLOP per CPU second with {OPENBLAS.name}, {slow:.1f} without")
    assert fast >= 3 * slow, (fast, slow)


def test_runner_environment_keeps_openblas_settings() -> None:
    """``OPENBLAS_CORETYPE`` / ``OPENBLAS_L2_SIZE`` and a set ``OPENBLAS_NUM_THREADS`` pass
    through untouched; the library is put first in ``LD_PRELOAD`` once; no library → no change."""
    lib = Path("/usr/lib/libopenblas.so.0")
    base = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "1048576", "LD_PRELOAD": f"/x/liba.so {lib}"}
    env = blas.runner_environment(base, lib, 4)
    assert env["OPENBLAS_CORETYPE"] == "Haswell" and env["OPENBLAS_L2_SIZE"] == "1048576"
    assert env["LD_PRELOAD"] == f"{lib} /x/liba.so" and env["OPENBLAS_NUM_THREADS"] == "4"
    assert blas.runner_environment({**base, "OPENBLAS_NUM_THREADS": "1"}, lib, 4)["OPENBLAS_NUM_THREADS"] == "1"
    assert blas.runner_environment(base, None, 4) == base
    assert blas.find_optimised_blas({blas.BLAS_ENV: ""}) is None
    assert blas.find_optimised_blas({blas.BLAS_ENV: "/nonexistent/libopenblas.so.0"}) is None


@needs_openblas
def test_node_runner_maps_openblas_and_logs_it(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "n", env={"OPENBLAS_NUM_THREADS": "2"})
    try:
        node.start()
        node.place_and_wait(MODEL, timeout=300)
        runners = _runner_processes(node)
        assert len(runners) == 1
        maps = blas.loaded_blas_libraries(runners[0].pid)
        assert any("libopenblas" in Path(m).name for m in maps), maps
        assert runners[0].environ().get("OPENBLAS_NUM_THREADS") == "2"
        assert [r for r in _log_records(node) if r.get("event") == "runners use an optimised BLAS"]
        r = node.chat("What is the capital of France?", MODEL, temperature=0, max_tokens=12)
        assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["message"]["content"], r.text
    finally:
        node.stop()


def test_node_without_optimised_blas_warns_once_and_serves(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "n", env={blas.BLAS_ENV: str(tmp_path / "no-such-libopenblas.so.0")},
                       extra_args=["--cpu-weights", "stored"])
    try:
        node.start()
        node.place_and_wait(MODEL, timeout=300)
        warnings = [r for r in _log_records(node) if "no optimised BLAS" in str(r.get("event"))]
        assert len(warnings) == 1 and blas.INSTALL_COMMAND in warnings[0]["event"], warnings
        runners = _runner_processes(node)
        assert len(runners) == 1
        assert not any("libopenblas" in Path(m).name for m in blas.loaded_blas_libraries(runners[0].pid))
        r = node.chat("What is the capital of France?", MODEL, temperature=0, max_tokens=3)
        assert r.status_code == 200, r.text
    finally:
        node.stop()


# --- weights per node: placement counts what the runner holds --------------------------------

@pytest.mark.parametrize(
    "limit,want",
    [("300MiB", "stored"), ("2GiB", "float32")],
    ids=["fits-stored-only", "fits-float32"],
)
def test_placement_decides_weights_and_reserves_what_the_runner_holds(tmp_path: Path, limit: str, want: str) -> None:
    from exo_p2p.models.card.derive import card_from_gguf
    from exo_p2p.models.stores.embedded import find_embedded_gguf

    card = card_from_gguf(find_embedded_gguf(), MODEL)
    node = NodeProcess(tmp_path / "n", extra_args=["--memory-limit", limit])
    try:
        node.start()

        def single_preview() -> dict | None:
            r = node.get("/instances/previews", params={"model": MODEL})
            found = [p for p in r.json() if p["sharding"] == "pipeline" and p["world_size"] == 1] if r.status_code == 200 else []
            return found[0] if found and found[0]["error"] is None else None

        wait_until(single_preview, 60, what="a preview once the node's memory and card are in State")
        preview = single_preview()
        assert preview is not None
        assert preview["weights"] == [want] and preview["bytes"] == [card.sized_for(want).storage_size], preview
        view = node.place_and_wait(MODEL, timeout=300)
        state = node.get("/state").json()
        (shard,) = state["instances"][view["instance_id"]]["shards"]
        assert shard["weights_dtype"] == want
        assert shard["share_bytes"] == card.sized_for(want).storage_size
        loaded = _loaded_record(node)
        assert loaded["weights_dtype"] == want and loaded["share_bytes"] == shard["share_bytes"]
        peak = loaded["peak_memory_bytes"]
        print(f"\n{limit}: {want} share {shard['share_bytes'] / 2**20:.1f} MiB, runner peak {peak / 2**20:.1f} MiB")
        assert 0.85 * shard["share_bytes"] <= peak <= 1.15 * shard["share_bytes"], (peak, shard["share_bytes"])
    finally:
        node.stop()


# --- float32 equals the stored weights -----------------------------------------------------

EQUALITY_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
    "Explain what a CPU does in one sentence.",
    "hello",
]


@pytest.mark.timeout(600)  # ~30 s alone, ~170 s beside two other workers on 2 cores (docs/testing.md)
def test_float32_greedy_output_equals_stored_weights(tmp_path: Path) -> None:
    """The embedded model expanded to float32 at load (``weights_dtype="float32"``) answers
    the e2e prompts greedily with the same tokens as its stored 4-bit weights (20 tokens
    each; also measured once with 2 more prompts and 32 tokens: equal): dequantization is
    exact, and the stored weights' float16 activations round no greedy choice differently
    here. The stored side is the slow one (~40 s on a quiet 2-core machine)."""
    from exo_p2p.models.stores.embedded import find_embedded_gguf
    from exo_p2p.models.gguf.importer import import_gguf
    from exo_p2p.types.engine import EngineSettings
    from exo_p2p.types.tasks import ChatMessage, GenerationParams
    from worker.engine.builder import build_engine
    from worker.engine.loading.loader import load_all

    model_dir = import_gguf(find_embedded_gguf(), tmp_path / "smollm2")
    tokens: dict[str, dict[str, list[int]]] = {}
    for weights in ("float32", "stored"):
        loaded = load_all(model_dir, weights_dtype=weights)
        assert loaded.weights_dtype == weights
        got = tokens.setdefault(weights, {})
        gen = build_engine(loaded, EngineSettings(prefill_chunk_size=64, max_batch=1),  # one at a time, as before
                           on_token=lambda t, tok: got.setdefault(t, []).append(tok))
        for i, prompt in enumerate(EQUALITY_PROMPTS):
            gen.submit(f"p{i}", GenerationParams(messages=(ChatMessage("user", prompt),), max_tokens=20, temperature=0))
        for _ in range(10_000):
            if not gen.has_work():
                break
            gen.step()
        del loaded, gen
    for i in range(len(EQUALITY_PROMPTS)):
        assert len(tokens["stored"][f"p{i}"]) >= 4
        assert tokens["float32"][f"p{i}"] == tokens["stored"][f"p{i}"], (i, EQUALITY_PROMPTS[i])


def test_pipeline_over_nodes_holding_different_weights(tmp_path: Path) -> None:
    """Two nodes, one of which (100 MiB) fits only the stored weights of its rank (the last:
    1 layer + the tied embedding, float32 ~127 MB + 10% > 100 MiB, stored ~34 MB): placement
    gives its rank stored weights and the roomy node's rank float32; the runners load what placement
    counted, exchange float32 activations, and answer greedily as one node does."""
    roomy = NodeProcess(tmp_path / "roomy")
    small = None
    try:
        roomy.start()
        small = NodeProcess(tmp_path / "small", cluster=roomy.cluster,
                            extra_args=["--memory-limit", "100MiB", *[a for addr in roomy.addrs() for a in ("--bootstrap", addr)]])
        small.start()
        wait_until(lambda: len(roomy.get("/state").json()["nodes"]) == 2 and all(
            n.get("memory_total") for n in roomy.get("/state").json()["nodes"].values()), 60, what="both nodes in State")
        view = roomy.place_and_wait(MODEL, timeout=300, min_nodes=2)
        shards = {s["node_id"]: s for s in view["shards"]}
        ids = {n["node_id"]: n for n in roomy.get("/nodes").json()}
        roomy_id = next(i for i, n in ids.items() if n["is_self"])
        small_id = next(i for i in ids if i != roomy_id)
        assert shards[roomy_id]["weights_dtype"] == "float32" and shards[small_id]["weights_dtype"] == "stored", shards
        for node, shard in ((roomy, shards[roomy_id]), (small, shards[small_id])):
            loaded = _loaded_record(node)
            assert loaded["weights_dtype"] == shard["weights_dtype"] and loaded["share_bytes"] == shard["share_bytes"]
            assert 0.85 * shard["share_bytes"] <= loaded["peak_memory_bytes"] <= 1.15 * shard["share_bytes"], loaded
        r = small.chat("What is the capital of France?", MODEL, temperature=0, max_tokens=12)
        assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["message"]["content"], r.text
    finally:
        if small is not None:
            small.stop()
        roomy.stop()
