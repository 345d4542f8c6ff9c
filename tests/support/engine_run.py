"""Generating with the engine in process and reading its chunks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.models.synthetic_models import make_synthetic_model
from exo_p2p.types.chunks import ErrorChunk, FinishChunk, TokenChunk
from exo_p2p.types.tasks import GenerationParams
from exo_p2p.types.engine import EngineSettings
from worker.engine.builder import build_engine
from worker.engine.scheduler import Engine
from worker.engine.loading.loader import LoadedModel, load_all


MAX_STEPS = 5_000


def msgs(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


Request = tuple[str, GenerationParams]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic_model(tmp_path_factory.mktemp("m") / "synthetic")


@pytest.fixture(scope="module")
def loaded(model_dir: Path) -> LoadedModel:
    return load_all(model_dir)


def run(gen: Engine, max_steps: int = MAX_STEPS) -> list:
    """Step ``gen`` until it has no work; every chunk in order."""
    out = []
    for _ in range(max_steps):
        if not gen.has_work():
            return out
        out.extend(gen.step())
    raise AssertionError("generator did not finish within the step bound")


def generate(loaded: LoadedModel, request: Request, **settings) -> tuple[list, list[int]]:
    """Every chunk of ``request`` served alone, and every token sampled for it;
    ``settings``: ``EngineSettings`` fields."""
    tokens: list[int] = []
    gen = build_engine(loaded, EngineSettings(**settings), on_token=lambda _t, tok: tokens.append(tok))
    gen.submit(*request)
    return run(gen), tokens


def text_of(chunks: list, task_id: str | None = None) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TokenChunk)
                   and (task_id is None or c.task_id == task_id))


def finish_of(chunks: list, task_id: str) -> FinishChunk:
    ends = [c for c in chunks if isinstance(c, (FinishChunk, ErrorChunk)) and c.task_id == task_id]
    assert len(ends) == 1, ends
    assert isinstance(ends[0], FinishChunk), ends[0]
    return ends[0]
