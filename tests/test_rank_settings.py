"""What ranks must share is decided once per instance: the placing master
fixes ``--prefill-chunk-size`` in the instance (``Instance.settings``) and every runner uses
it (``EngineSettings.for_runner``), so nodes started with different values still serve together."""

from __future__ import annotations

import httpx
import msgspec
import pytest

from exo_p2p.state import apply
from exo_p2p.types.engine import EngineSettings
from exo_p2p.types import IndexedEvent, InstanceCreated, InstanceFailed, PlaceInstance, RankSettings
from master.admission import PREFILL_CHUNK_BOUND, activation_bytes, memory_refusal, prompt_token_bound
from master.commands import handle_command
from master.replace import replacement
from tests.conftest import tiny_models_dir
from tests.support.cluster import NodeProcess, converged, nodes_cleanup, wait_until
from tests.support.rules.placement_cluster import card, cluster

GIB = 1 << 30


def _placed(settings: RankSettings | None):
    state = cluster([(8 * GIB, 8 * GIB), (8 * GIB, 8 * GIB)])
    state = msgspec.structs.replace(state, model_cards={"m": card(4, GIB)})
    decision = handle_command(state, PlaceInstance("p1", "m", min_nodes=2), rank_settings=settings)
    (created,) = decision.events
    assert isinstance(created, InstanceCreated)
    return apply(state, IndexedEvent(1, 1, created)), created.instance


def test_the_master_fixes_its_settings_in_the_instance_and_runners_use_them():
    state, instance = _placed(RankSettings(prefill_chunk_size=16))
    assert instance.settings == RankSettings(16) and state.instances[instance.instance_id] == instance
    # every rank uses the instance's value, whatever its node was started with
    for node_value in (4, 16, 512):
        node = EngineSettings(prefill_chunk_size=node_value, max_batch=4, prompt_cache_bytes=100, kv_cache_bytes=7)
        ran = node.for_runner(instance.settings, 1000)
        # the instance's rank settings (16 tokens, a batch of 1), the node's own cache bound and budget
        assert ran == EngineSettings(prefill_chunk_size=16, max_batch=1, prompt_cache_bytes=100, kv_cache_bytes=1000)
    # an instance placed without settings: each node's own value (what older masters did)
    _, legacy = _placed(None)
    node = EngineSettings(prefill_chunk_size=4, max_batch=2)
    assert legacy.settings is None and node.for_runner(legacy.settings, None) == node
    assert node.for_runner(legacy.settings, None).rank_settings() == RankSettings(4, 2)


def test_a_replacement_keeps_the_settings_decided_at_first_placement():
    state, instance = _placed(RankSettings(prefill_chunk_size=16))
    state = apply(state, IndexedEvent(1, 2, InstanceFailed(instance.instance_id, "boom")))
    failed = state.instances[instance.instance_id]
    events = replacement(state, failed, "new", rank_settings=RankSettings(64))
    created = next(e for e in events if isinstance(e, InstanceCreated))
    assert created.instance.settings == RankSettings(16)
    # one placed without settings takes the (new) master's
    legacy = msgspec.structs.replace(failed, settings=None)
    events = replacement(msgspec.structs.replace(state, instances={failed.instance_id: legacy}), legacy, "new2", rank_settings=RankSettings(64))
    assert next(e for e in events if isinstance(e, InstanceCreated)).instance.settings == RankSettings(64)


def test_admission_counts_the_instances_prefill_chunk():
    from exo_p2p.types import ChatMessage, GenerationParams

    state, instance = _placed(RankSettings(prefill_chunk_size=8))
    model = state.model_cards["m"]
    params = GenerationParams((ChatMessage("user", "word " * 200),), max_tokens=1)  # type: ignore[arg-type]
    tokens = prompt_token_bound(params, model.context_length)
    assert activation_bytes(model, tokens, chunk_tokens=8) < activation_bytes(model, tokens, chunk_tokens=PREFILL_CHUNK_BOUND)
    assert memory_refusal(state, instance, model, params) is None


# --- real nodes ---------------------------------------------------------------------------------

MODEL = "tiny"
PROMPTS = ["one two three four five six seven eight nine ten eleven twelve " * 4, "hello there"]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tiny_models_dir(tmp_path_factory, n_layers=4, hidden_size=64, intermediate_size=128, seed=9)


def _chat(node, content: str) -> str:
    r = node.chat(content, MODEL, max_tokens=10, temperature=0, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def _place(node, **body) -> str:
    r = node.post("/instances", json={"model": MODEL, **body})
    assert r.status_code == 201, r.text
    iid = r.json()["instance_id"]

    def ready() -> bool:
        view = node.get(f"/instances/{iid}").json()
        assert view["status"] != "failed", view
        return view["status"] == "ready"

    wait_until(ready, 90, what="instance ready")
    return iid


@pytest.mark.integration
def test_nodes_with_different_prefill_chunk_sizes_serve_a_two_node_instance(tmp_path, models_dir):
    """A (master, ``--prefill-chunk-size 16``) and B (``4``): a 2-node pipeline instance
    answers a prompt of ~50 tokens — several prefill chunks either way — exactly as a
    single-node instance does. Without the instance's value the ranks prefilled in chunks of
    16 and 4, deadlocked at their first hand-off and were killed as silent."""
    models = ["--models-dir", str(models_dir)]
    a = NodeProcess(tmp_path / "a", extra_args=[*models, "--prefill-chunk-size", "16"])
    nodes = [a]
    with nodes_cleanup(nodes):
        a.start()
        boot = [x for addr in a.addrs() for x in ("--bootstrap", addr)]
        b = NodeProcess(tmp_path / "b", cluster=a.cluster, extra_args=[*models, "--prefill-chunk-size", "4", *boot])
        nodes.append(b)
        b.start()
        wait_until(lambda: converged(nodes, 2), 30, what="2-node cluster")
        single = _place(a, min_nodes=1)
        expected = [_chat(a, p) for p in PROMPTS]
        assert httpx.delete(a.url + f"/instances/{single}", timeout=30).status_code == 200
        iid = _place(a, min_nodes=2)
        placed = a.get("/state").json()["instances"][iid]
        assert placed["settings"] == {"prefill_chunk_size": 16, "max_batch": 16, "kv_cache_bits": 0} and len(placed["shards"]) == 2
        assert [_chat(b, p) for p in PROMPTS] == expected
        assert [_chat(a, p) for p in PROMPTS] == expected


def test_the_prompt_cache_takes_at_most_a_quarter_of_a_known_kv_budget():
    node = EngineSettings(prompt_cache_bytes=256 << 20)
    assert node.for_runner(None, 400 << 20).prompt_cache_bytes == 100 << 20
    assert node.for_runner(None, 4 << 30).prompt_cache_bytes == 256 << 20
    assert node.for_runner(None, None).prompt_cache_bytes == 256 << 20  # no budget known: no memory check
