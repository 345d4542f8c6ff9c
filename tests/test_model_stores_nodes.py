"""Model stores served by real nodes (docs/models.md#model-stores): node A reads an Ollama models
dir and an LM Studio models dir made by the test, lists their models (``exo-p2p models``,
``--json``, ``/v1/models``, Ollama's ``/api/tags``) with what it cannot serve, and serves them;
node B, without the stores, gets the Ollama model from A (its shard travels) and answers the
same greedy text. Neither node writes into the stores."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.models.synthetic_models import make_synthetic_model
from tests.support.cluster import NodeProcess, converged, nodes_cleanup, self_id, wait_until
from tests.support.models.store_layouts import ollama_model, tiny_gguf, tree_snapshot

pytestmark = pytest.mark.integration
OLLAMA = "ollama:tiny:latest"
LMSTUDIO = "lmstudio:test-pub/tiny-mlx"
PROMPT = "Say something."


def _cli(node: NodeProcess, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exo_p2p", *args, "--api", node.url],
                          capture_output=True, text=True, timeout=300)


def _held(node: NodeProcess, holder: str, name: str) -> list:
    profile = node.get("/state").json().get("nodes", {}).get(holder) or {}
    return [h for h in profile.get("held_models") or [] if h[0] == name]


def _greedy(node: NodeProcess, model: str) -> str:
    r = node.chat(PROMPT, model, max_tokens=8, temperature=0)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


@pytest.mark.timeout(600)  # two placements with an import and a shard fetch; ~90 s alone here
def test_store_models_are_listed_served_and_travel(tmp_path) -> None:
    ollama, lmstudio = tmp_path / "ollama", tmp_path / "lmstudio"
    ollama_model(ollama, tiny_gguf(tmp_path / "tiny.gguf", seed=3), "tiny", "latest")
    ollama_model(ollama, None, "no-weights", "latest")  # listed as unsupported, with the reason
    make_synthetic_model(lmstudio / "test-pub" / "tiny-mlx", n_layers=2, hidden_size=32, intermediate_size=64)
    before = {root: tree_snapshot(root) for root in (ollama, lmstudio)}
    with nodes_cleanup([]) as nodes:
        a = NodeProcess(tmp_path / "a", extra_args=["--ollama-models", str(ollama), "--lmstudio-models", str(lmstudio)]).start()
        nodes.append(a)
        b = NodeProcess(tmp_path / "b", cluster=a.cluster,
                        extra_args=[x for addr in a.addrs() for x in ("--bootstrap", addr)]).start()
        nodes.append(b)
        wait_until(lambda: converged([a, b], 2), 30, what="2-node cluster")
        a_id, b_id = self_id(a), self_id(b)

        # listed: this node's models with their source, what it cannot serve, the cluster's
        listing = _cli(a, "models", "--json")
        assert listing.returncode == 0, listing.stderr
        by_name = {m["model"]: m for m in json.loads(listing.stdout)}
        assert by_name[OLLAMA]["source"] == "ollama" and by_name[OLLAMA]["n_layers"] == 2
        assert by_name[LMSTUDIO]["source"] == "lmstudio" and by_name[LMSTUDIO]["n_layers"] == 2
        assert "no GGUF model layer" in by_name["ollama:no-weights:latest"]["unsupported"]
        table = _cli(a, "models")
        assert table.returncode == 0 and OLLAMA in table.stdout and "cannot serve" in table.stdout
        wait_until(lambda: {OLLAMA, LMSTUDIO} <= {m["id"] for m in b.get("/v1/models").json()["data"]}, 30,
                   what="B's /v1/models lists A's store models")
        assert OLLAMA in {m["name"] for m in b.get("/api/tags").json()["models"]}
        assert not {OLLAMA, LMSTUDIO} & {m["model"] for m in b.get("/models").json()}  # B holds none of them
        ollama_model(ollama, tiny_gguf(tmp_path / "late.gguf", seed=4), "late", "latest")  # `ollama pull` meanwhile
        before[ollama] = tree_snapshot(ollama)

        # served by A: placed with the CLI under the name without its tag
        placed = _cli(a, "place", "ollama:tiny", "--nodes", a_id, "--timeout", "240")
        assert placed.returncode == 0, placed.stderr
        text_a = _greedy(a, OLLAMA)
        assert text_a, "seed 3's model answers some text (two empty answers would prove nothing below)"
        assert _greedy(a, "ollama:tiny") == text_a  # the API reads a name without its tag as :latest
        ollama_api = a.post("/api/chat", json={"model": "tiny", "stream": False, "options": {"temperature": 0, "num_predict": 8},
                                               "messages": [{"role": "user", "content": PROMPT}]})
        assert ollama_api.status_code == 200 and ollama_api.json()["message"]["content"] == text_a, ollama_api.text

        # travels: once A published the imported model's manifest, B alone serves it, from A's chunks
        held = wait_until(lambda: [h for h in _held(b, a_id, OLLAMA) if h[2]], 60, what="A's manifest of the import in State")
        stopped = _cli(a, "stop", OLLAMA)
        assert stopped.returncode == 0, stopped.stderr
        on_b = b.place_and_wait(OLLAMA, timeout=240, nodes=[b_id])
        assert [s["node_id"] for s in on_b["shards"]] == [b_id]
        assert _greedy(b, OLLAMA) == text_a
        # B's profile carries its copy within a profile round (2 s) and a gossip hop: 30 s with slack
        wait_until(lambda: any(h[1] == held[0][1] for h in _held(a, b_id, OLLAMA)), 30,
                   what="B's profile, as A sees it, holds the same manifest as A")
        pulled = _cli(b, "pull", "ollama:tiny")  # a copy of its own, under the store's name
        assert pulled.returncode == 0, pulled.stderr
        wait_until(lambda: {m["model"]: m.get("source") for m in b.get("/models").json()}.get(OLLAMA) == "pulled", 30,
                   what="B lists its pulled copy")

        # a model added to the store while A runs is listed within REFRESH_SECONDS (30 s; 60 s with slack)
        wait_until(lambda: "ollama:late:latest" in {m["id"] for m in b.get("/v1/models").json()["data"]}, 60,
                   what="the model added to A's store listed")

        # the LM Studio MLX model is served in place
        a.place_and_wait(LMSTUDIO, timeout=240, nodes=[a_id])
        r = a.chat(PROMPT, LMSTUDIO, max_tokens=4, temperature=0)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, r.text
    assert {root: tree_snapshot(root) for root in (ollama, lmstudio)} == before
    assert (tmp_path / "a" / "models" / OLLAMA / "config.json").is_file()  # the import: in A's data dir


@pytest.mark.timeout(400)  # a node start, an import and one answer; ~40 s alone here
def test_run_answers_with_an_ollama_model_of_the_machine(tmp_path) -> None:
    """``exo-p2p run ollama:tiny PROMPT`` as a user types it: no node answers, so it starts a
    private one that finds the model in Ollama's dir (``OLLAMA_MODELS``, as Ollama reads it),
    places it under the name with ``:latest``, answers and stops everything."""
    import os

    import psutil

    from tests.support.cluster import free_port

    ollama = tmp_path / "ollama"
    ollama_model(ollama, tiny_gguf(tmp_path / "tiny.gguf", seed=3), "tiny", "latest")
    before = tree_snapshot(ollama)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXO_P2P_")}
    env.update(HF_HUB_OFFLINE="1", OLLAMA_MODELS=str(ollama), EXO_P2P_LMSTUDIO_MODELS=str(tmp_path / "no-lmstudio"))
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from exo_p2p.cli import main; from exo_p2p.cli.node_api import endpoint; "
         f"endpoint.DEFAULT_API = 'http://127.0.0.1:{free_port()}'; sys.argv[0] = 'exo-p2p'; main.main()",
         "run", "ollama:tiny", PROMPT, "--temperature", "0", "--max-tokens", "8", "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=360, env=env,
    )  # fmt: skip
    log = (tmp_path / "data" / "run-node.log")
    assert proc.returncode == 0, proc.stderr + (log.read_text() if log.exists() else "")
    assert proc.stdout.strip() and OLLAMA in proc.stderr, proc.stderr  # "placed ollama:tiny:latest ..."
    assert tree_snapshot(ollama) == before
    left = [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert left == []
