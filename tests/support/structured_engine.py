"""Serving structured output with the engine in process."""

from __future__ import annotations

import pytest

from tests.support.models.synthetic_models import make_synthetic_model
from exo_p2p.types.chunks import ErrorChunk, FinishChunk, TokenChunk
from exo_p2p.types.engine import EngineSettings
from exo_p2p.types.tasks import ChatMessage, GenerationParams, OutputFormat
from worker.engine.builder import build_engine
from worker.engine.loading.loader import LoadedModel, load_all
from worker.engine.scheduler import Engine


MAX_STEPS = 2_000


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_all(make_synthetic_model(tmp_path_factory.mktemp("m") / "synthetic"))


def params(text: str = "hello", fmt: OutputFormat | None = None, **kw) -> GenerationParams:
    return GenerationParams(messages=(ChatMessage("user", text),), output_format=fmt,
                            **{"max_tokens": 120, "temperature": 0.0, **kw})


def run(gen: Engine) -> list:
    out: list = []
    for _ in range(MAX_STEPS):
        if not gen.has_work():
            return out
        out += gen.step()
    raise AssertionError("the engine did not finish within the step bound")


def result(chunks: list, task_id: str) -> tuple[str, FinishChunk | ErrorChunk]:
    text = "".join(c.text for c in chunks if isinstance(c, TokenChunk) and c.task_id == task_id)
    ends = [c for c in chunks if isinstance(c, (FinishChunk, ErrorChunk)) and c.task_id == task_id]
    assert len(ends) == 1, ends
    return text, ends[0]


def serve(loaded: LoadedModel, requests: dict[str, GenerationParams], **settings_) -> dict[str, tuple[str, object]]:
    gen = build_engine(loaded, EngineSettings(**{"max_batch": 8, **settings_}))
    for task_id, p in requests.items():
        gen.submit(task_id, p)
    chunks = run(gen)
    return {task_id: result(chunks, task_id) for task_id in requests}
