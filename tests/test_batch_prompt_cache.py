"""The prompt cache on a multi-rank instance: rank 0 decides the reused prefix
length and every rank reuses that length (``PromptCache.agreed_length``), so a second turn of a
conversation on a 2-rank pipeline prefills only its new tokens and answers exactly as a run
without the cache."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from exo_p2p.types.chunks import PrefillProgressChunk, TokenChunk  # noqa: E402
from exo_p2p.types.engine import EngineSettings  # noqa: E402
from exo_p2p.types.tasks import ChatMessage, GenerationParams  # noqa: E402
from tests.support.batch_drive import CHUNK, PROMPTS, drive  # noqa: E402
from worker.engine.builder import build_engine  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from tests.support.models.synthetic_models import make_synthetic_model
    from worker.engine.loading.loader import load_all

    return load_all(make_synthetic_model(tmp_path_factory.mktemp("pcache") / "synthetic", n_layers=4))


@pytest.mark.parametrize("cache_on_rank1", [True, False])
def test_second_turn_on_a_two_rank_pipeline_prefills_only_new_tokens(loaded, cache_on_rank1: bool) -> None:
    """Turn 1, then turn 2 (turn 1's answer and a new question) on two pipeline runner ranks
    with ``--max-batch 4``. With the prompt cache on both ranks, turn 2's prefill starts after
    the cached prefix (its first progress chunk: exactly the shared prefix's tokens) and its
    text equals the no-cache run's; with the cache on rank 0 only, no rank reuses anything
    (a rank without the prefix cannot reuse it) and the answer is the same."""
    from exo_p2p.types.tasks import ConnectToGroup, TextGeneration
    from tests.support.runners import RunnerProc, bring_up, make_instance, shut_down_cleanly, wait_for
    from worker.runner.protocol import RunnerSetup

    def params(messages) -> GenerationParams:
        return GenerationParams(messages=tuple(ChatMessage(m["role"], m["content"]) for m in messages),
                                max_tokens=12, temperature=0.0)

    first = [{"role": "user", "content": PROMPTS[2]}]
    cold = build_engine(loaded, EngineSettings(prefill_chunk_size=CHUNK, max_batch=4))  # no prompt cache
    cold.submit("c1", params(first))
    got1 = drive(cold)
    ids1, text1 = got1["ids"]["c1"], got1["texts"]["c1"]
    second = [*first, {"role": "assistant", "content": text1}, {"role": "user", "content": "and then?"}]
    cold.submit("c2", params(second))
    text2 = drive(cold)["texts"]["c2"]
    prompt1 = loaded.tokenizer.apply_chat_template(first, add_generation_prompt=True)
    prompt2 = loaded.tokenizer.apply_chat_template(second, add_generation_prompt=True)
    cached = prompt1 + ids1  # the KV turn 1 leaves: its prompt and every token fed after it
    common = next((i for i, (a, b) in enumerate(zip(cached, prompt2)) if a != b), min(len(cached), len(prompt2)))
    expected_reuse = min(common, len(prompt2) - 1) if cache_on_rank1 else 0
    assert common >= len(prompt1)

    instance = make_instance(loaded.model_dir, 2)
    budgets = {0: 64 * 2**20, 1: 64 * 2**20 if cache_on_rank1 else 0}
    runners = [RunnerProc(RunnerSetup(instance=instance, shard=s, model_dir=str(loaded.model_dir), heartbeat_interval=0.5,
                                      engine=EngineSettings(prefill_chunk_size=CHUNK, max_batch=4, prompt_cache_bytes=budgets[s.rank])))
               for s in instance.shards]

    def task(i: int, task_id: str, messages) -> TextGeneration:
        return TextGeneration(task_id=task_id, instance_id="i1", model_id="synthetic", api_node_id="n0", created_idx=i,
                              params=params(messages))

    try:
        for r in runners:
            r.send(ConnectToGroup(runner_id="x"))
        bring_up(runners)
        for i, (task_id, messages) in enumerate([("w1", first), ("w2", second)]):
            t = task(i, task_id, messages)
            for r in runners:
                r.send(t)
            wait_for(lambda: all("complete" in r.task_status(task_id) for r in runners), 60, f"{task_id} complete")
        text = {tid: "".join(c.text for c in runners[0].chunks(tid) if isinstance(c, TokenChunk)) for tid in ("w1", "w2")}
        assert text == {"w1": text1, "w2": text2}
        progress = [c for c in runners[0].chunks("w2") if isinstance(c, PrefillProgressChunk)]
        assert progress[0].total == len(prompt2)
        assert progress[0].processed == expected_reuse  # prefilled: only len(prompt2) - reuse tokens
        chunked = [c.processed for c in progress[1:-1]]  # each prefill chunk after the reused prefix
        assert chunked and chunked[0] == expected_reuse + min(CHUNK, len(prompt2) - 1 - expected_reuse)
        shut_down_cleanly(runners)
    finally:
        for r in runners:
            r.close()
