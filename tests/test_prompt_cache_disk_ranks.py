"""The prompt cache's disk tier on a 2-rank pipeline of runner processes: an agent session
(a ~6k-token system prompt), the runners shut down after turn 4 and started again (a new ring,
the same layers per rank, each rank its own directory). Turn 5's prefill starts after the
restored prefix — the reused length is the smallest rank's, so both ranks read their own
layers' block back — its first token comes in at most 1/5 of turn 1's cold prefill time, and
the answers equal a run without the tier."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from exo_p2p.types.chunks import PrefillProgressChunk, TokenChunk  # noqa: E402
from exo_p2p.types.engine import EngineSettings  # noqa: E402
from exo_p2p.types.tasks import GenerationParams  # noqa: E402
from tests.support.agent_session import replay, session_messages, system_prompt  # noqa: E402
from worker.engine.builder import build_engine  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]
SYSTEM = system_prompt(6000)
CACHE = 64 << 20


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from tests.support.models.synthetic_models import make_synthetic_model
    from worker.engine.loading.loader import load_all

    return load_all(make_synthetic_model(tmp_path_factory.mktemp("ranks") / "synthetic", n_layers=4, context_length=16384))


def start(loaded, tmp_path: Path):  # type: ignore[no-untyped-def]
    from exo_p2p.types.tasks import ConnectToGroup
    from tests.support.runners import RunnerProc, bring_up, make_instance
    from worker.runner.protocol import RunnerSetup

    instance = make_instance(loaded.model_dir, 2)
    runners = [RunnerProc(RunnerSetup(instance=instance, shard=s, model_dir=str(loaded.model_dir), heartbeat_interval=0.5,
                                      engine=EngineSettings(prefill_chunk_size=512, prompt_cache_bytes=CACHE,
                                                            prompt_cache_disk_bytes=CACHE,
                                                            prompt_cache_dir=str(tmp_path / f"rank{s.rank}"))))
               for s in instance.shards]
    for r in runners:
        r.send(ConnectToGroup(runner_id="x"))
    bring_up(runners)
    return runners


def turn(runners, i: int, answers: list[str]) -> tuple[str, float, int]:  # type: ignore[no-untyped-def]
    """Turn ``i`` on the runners: its text, seconds to its first token, and the prompt tokens
    its prefill started after (the reused prefix)."""
    from exo_p2p.types.tasks import TextGeneration
    from tests.support.runners import wait_for

    params = GenerationParams(messages=tuple(session_messages(SYSTEM, i, answers)), max_tokens=12, temperature=0.0)
    task = TextGeneration(task_id=f"t{i}", instance_id="i1", model_id="synthetic", api_node_id="n0", created_idx=i, params=params)
    sent = time.monotonic()
    for r in runners:
        r.send(task)
    wait_for(lambda: any(isinstance(c, TokenChunk) for c in runners[0].chunks(task.task_id)), 600, f"{task.task_id} first token")
    ttft = time.monotonic() - sent
    wait_for(lambda: all("complete" in r.task_status(task.task_id) for r in runners), 120, f"{task.task_id} complete")
    chunks = runners[0].chunks(task.task_id)
    progress = [c for c in chunks if isinstance(c, PrefillProgressChunk)]
    return "".join(c.text for c in chunks if isinstance(c, TokenChunk)), ttft, progress[0].processed


def test_both_ranks_restore_turn_5_after_the_runners_restart(loaded, tmp_path: Path) -> None:
    from tests.support.runners import shut_down_cleanly

    reference: list[str] = []
    replay(build_engine(loaded, EngineSettings(prefill_chunk_size=512)), SYSTEM, range(6), reference)
    answers: list[str] = []
    runners = start(loaded, tmp_path)
    try:
        served = [turn(runners, i, answers) for i in range(1)]
        answers.append(served[0][0])
        for i in range(1, 4):
            answers.append(turn(runners, i, answers)[0])
        shut_down_cleanly(runners)  # each rank's queued block written before it exits
    finally:
        for r in runners:
            r.close()
    runners = start(loaded, tmp_path)
    try:
        restored = turn(runners, 4, answers)
        answers.append(restored[0])
        answers.append(turn(runners, 5, answers)[0])
        shut_down_cleanly(runners)
    finally:
        for r in runners:
            r.close()
    assert answers == reference
    assert restored[2] >= 6000, restored[2]  # the agreed length: every rank restored its block
    assert restored[1] <= served[0][1] / 5, (restored[1], served[0][1])
    print(f"\n2-rank pipeline: turn 5 TTFT restored {restored[1] * 1000:.0f} ms ({restored[2]} tokens), "
          f"turn 1 cold {served[0][1] * 1000:.0f} ms")
