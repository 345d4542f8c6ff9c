"""Memory admission: a prompt within the context whose estimated KV-cache and
activation memory exceeds a rank's free memory is refused before prefill — by the master,
before the task exists — and the runner stays alive and Ready (``master.admission``)."""

from __future__ import annotations

import time

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exo_p2p.defaults import PREFILL_CHUNK_SIZE
from exo_p2p.models.card.derive import card_from_model_dir
from tests.support.models.synthetic_models import make_synthetic_model
from exo_p2p.types import ChatMessage, GenerationParams, Instance, InstanceCreated, ModelCard, RunnerReady, RunnerStatusUpdated, ShardMetadata, State, SubmitTask, TaskCreated
from master.admission import (
    activation_bytes,
    kv_bytes_per_token,
    memory_refusal,
    prompt_token_bound,
    rank_needs,
)
from master.commands import handle_command
from tests.support.cluster import NodeProcess, wait_until
from tests.support.rules.memory_pipeline import CARD8, GIB, _cluster, _params, _pipeline, _run

MODEL = "tiny"

cards = st.builds(
    lambda layers, kv, group, hd, dt, hidden, vocab: ModelCard(
        model_id="m", n_layers=layers, hidden_size=hidden, num_attention_heads=kv * group, num_key_value_heads=kv,
        vocab_size=vocab, context_length=4096, storage_size=layers * 100, layer_bytes=(100,) * layers,
        embedding_bytes=0, head_bytes=0, norm_bytes=0, tie_word_embeddings=True, head_dim=hd, activation_dtype_bytes=dt,
    ),
    st.integers(1, 96), st.integers(1, 16), st.integers(1, 8), st.one_of(st.none(), st.sampled_from([32, 64, 128, 256])),
    st.one_of(st.none(), st.sampled_from([1, 2, 4])), st.sampled_from([64, 576, 4096]), st.integers(1, 200_000),
)


# --- the per-token KV estimate ---------------------------------------------------------------


def test_kv_per_token_of_smollm2_shape():
    """SmolLM2-135M: 30 layers × 3 kv heads × 64 (576 / 9) × 2 (K, V) × 2 bytes (float16)."""
    card = ModelCard("s", 30, 576, 9, 3, 49152, 8192, 1, (1,) * 30, 0, 0, 0, True, activation_dtype_bytes=2)
    assert kv_bytes_per_token(card) == 30 * 3 * 64 * 2 * 2
    # without a dtype the estimate assumes float32 (never below the real size)
    assert kv_bytes_per_token(msgspec.structs.replace(card, activation_dtype_bytes=None)) == 2 * kv_bytes_per_token(card)


def test_kv_estimate_equals_the_cache_mlx_lm_fills(tmp_path):
    """The estimate of a synthetic model's card is exactly the bytes its mlx-lm KV cache holds
    after a prefill of T tokens (float32 weights, so float32 K and V)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    make_synthetic_model(tmp_path / MODEL, n_layers=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    card = card_from_model_dir(tmp_path / MODEL, MODEL)
    model, _ = load_model(tmp_path / MODEL)
    cache = make_prompt_cache(model)
    tokens = 37
    model(mx.arange(tokens)[None], cache=cache)
    held = 0
    for layer in cache:
        keys, values = layer.keys[..., : layer.offset, :], layer.values[..., : layer.offset, :]
        mx.eval(keys, values)
        assert keys.shape[-2] == tokens
        held += keys.nbytes + values.nbytes
    assert held == tokens * kv_bytes_per_token(card)


@given(card=cards, data=st.data())
def test_pipeline_ranks_hold_only_their_layers_kv(card, data):
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, card.n_layers - 1)), max_size=min(3, card.n_layers - 1))))
    inst = _pipeline(card, cuts, [f"n{i}" for i in range(len(cuts) + 1)])
    per_rank = [kv_bytes_per_token(card, s, "pipeline") for s in inst.shards]
    assert sum(per_rank) == kv_bytes_per_token(card)
    for s, b in zip(inst.shards, per_rank):
        assert b * card.n_layers == kv_bytes_per_token(card) * (s.end_layer - s.start_layer)


@given(card=cards, world=st.integers(1, 8))
def test_tensor_ranks_hold_a_share_of_every_layer(card, world):
    shard = ShardMetadata("n0", "r0", 0, world, 0, card.n_layers, card.n_layers, 1, "b")
    one = kv_bytes_per_token(card, shard, "tensor")
    assert one * world >= kv_bytes_per_token(card)  # ceil: never under-estimated
    assert one <= kv_bytes_per_token(card)
    if card.num_key_value_heads % world == 0:
        assert one * world == kv_bytes_per_token(card)


@given(card=cards, t=st.integers(1, 4096), more=st.integers(0, 4096))
def test_need_grows_with_the_prompt_and_only_the_last_pipeline_rank_pays_logits(card, t, more):
    assert activation_bytes(card, t + more) >= activation_bytes(card, t)
    if card.n_layers >= 2:
        inst = _pipeline(card, [card.n_layers // 2], ["a", "b"])
        first, last = (activation_bytes(card, t, s, "pipeline") for s in inst.shards)
        assert last - first == min(t, 256) * card.vocab_size * 4


# --- the prompt-token bound ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    make_synthetic_model(d / MODEL, n_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, seed=3)
    return d


@pytest.fixture(scope="module")
def tokenizer(tiny):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    return load_tokenizer(tiny / MODEL)


def _tokens(tokenizer, params: GenerationParams) -> int:
    messages = [{"role": m.role, "content": m.content} for m in params.messages]
    return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    messages=st.lists(
        st.tuples(st.sampled_from(["system", "user", "assistant"]), st.text(max_size=300)), min_size=1, max_size=4
    )
)
def test_token_bound_is_never_below_the_real_prompt(tokenizer, messages):
    params = GenerationParams(tuple(ChatMessage(r, c) for r, c in messages), max_tokens=1)  # type: ignore[arg-type]
    real = _tokens(tokenizer, params)
    assert prompt_token_bound(params, 10**9) >= real
    assert prompt_token_bound(params, 100) == min(100, prompt_token_bound(params, 10**9))


# --- the master's decision -------------------------------------------------------------------


@given(
    free_a=st.one_of(st.none(), st.integers(0, 64 * 2**20)),
    free_b=st.one_of(st.none(), st.integers(0, 64 * 2**20)),
    text=st.text(alphabet="abc ", max_size=3000),
    cut=st.integers(1, 7),
)
def test_submit_is_refused_503_iff_some_rank_lacks_the_memory(free_a, free_b, text, cut):
    inst = _pipeline(CARD8, [cut], ["a", "b"])
    state = _cluster(CARD8, {"a": free_a, "b": free_b}, inst)
    params = _params(text)
    tokens = prompt_token_bound(params, CARD8.context_length)
    needs = rank_needs(state, inst, CARD8, tokens)
    d = handle_command(state, SubmitTask.generation("c", "t", "m", params, "a"))
    if all(n.fits for n in needs):
        assert d.result.error is None and isinstance(d.events[0], TaskCreated)
    else:
        err = d.result.error
        assert err.status == 503 and err.code == "out_of_memory" and d.events == ()
        short = next(n for n in needs if not n.fits)
        assert "out of memory" in err.message and str(short.need_bytes) in err.message and str(short.free_bytes) in err.message
        # a longer prompt never needs less
        assert memory_refusal(state, inst, CARD8, _params(text + "more")) is not None
    if d.result.error is None:  # and a shorter one never more
        assert memory_refusal(state, inst, CARD8, _params(text[: len(text) // 2])) is None


def test_submit_goes_to_the_instance_that_has_the_memory():
    small = _pipeline(CARD8, [], ["a"])
    roomy = msgspec.structs.replace(_pipeline(CARD8, [], ["b"]), instance_id="z-inst")
    state = _cluster(CARD8, {"a": 4 * 2**20, "b": 8 * GIB}, small)
    state = _run(state, [InstanceCreated(roomy), RunnerStatusUpdated("r0", "z-inst", "b", RunnerReady())])
    long = _params("word " * 800)
    assert memory_refusal(state, small, CARD8, long) is not None and memory_refusal(state, roomy, CARD8, long) is None
    d = handle_command(state, SubmitTask.generation("c", "t", "m", long, "a"))
    assert d.result.error is None and d.events[0].task.instance_id == "z-inst"
    # a short prompt goes by load as before (ties: the smaller instance id)
    d = handle_command(state, SubmitTask.generation("c", "t", "m", _params("hi"), "a"))
    assert d.events[0].task.instance_id == "inst"


# --- one node, end to end --------------------------------------------------------------------


@pytest.mark.integration
def test_prompt_that_does_not_fit_free_memory_is_refused_and_runner_survives(tmp_path, tiny, tokenizer):
    card = card_from_model_dir(tiny / MODEL, MODEL)
    long = _params("the sea " * 180)
    normal = _params("tell me about the sea")
    real = _tokens(tokenizer, long)
    assert real < card.context_length  # within the context: not the context rule's refusal
    whole = Instance("x", MODEL, "pipeline", (ShardMetadata("n", "r", 0, 1, 0, card.n_layers, card.n_layers, 1, "b"),))

    def need(params: GenerationParams) -> int:
        # prefilled in chunks of the instance's prefill_chunk_size: the node's default here
        return rank_needs(State(), whole, card, prompt_token_bound(params, card.context_length), PREFILL_CHUNK_SIZE)[0].need_bytes

    free = (need(long) + need(normal)) // 2  # between what the normal and the long prompt need
    node = NodeProcess(tmp_path / "n", extra_args=["--models-dir", str(tiny), "--fault-hook", f"free_memory={free}"])
    try:
        node.start()
        node.place_and_wait(MODEL, timeout=90)
        wait_until(lambda: node.get("/nodes").json()[0]["memory_available"] == free, 10, what="hooked free memory in State")
        (runner,) = node.children()
        for stream in (True, False):
            body = {"model": MODEL, "messages": [{"role": "user", "content": long.messages[0].content}], "max_tokens": 100, "stream": stream}
            t0 = time.monotonic()
            r = node.post("/v1/chat/completions", json=body)
            took = time.monotonic() - t0
            assert r.status_code == 503, r.text
            error = r.json()["error"]
            assert error["code"] == "out_of_memory" and "out of memory" in error["message"] and str(free) in error["message"]
            assert took < 5.0, took  # decided by the master from State: no prefill, no queue
        # the runner was never asked: same process, alive, Ready, no task left in State
        assert runner.is_running() and [p.pid for p in node.children()] == [runner.pid]
        state = node.get("/state").json()
        assert state["tasks"] == {}
        assert [rec["status"]["kind"] for rec in state["runners"].values()] == ["ready"]
        r = node.chat(normal.messages[0].content, MODEL, max_tokens=100, temperature=0)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] > 0
        assert [p.pid for p in node.children()] == [runner.pid]
    finally:
        node.stop()
