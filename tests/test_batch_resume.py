"""Resuming on the batch path (``exo_p2p.api.generation.resume`` with continuous batching): a request moved to a batched instance
(``resume_tokens``: the tokens its earlier task sent) continues exactly like the
uninterrupted run — same tokens, text pieces, usage and finish — while other sequences share
its batch."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from exo_p2p.types import ErrorChunk, FinishChunk, TokenChunk  # noqa: E402
from exo_p2p.types.engine import EngineSettings  # noqa: E402
from exo_p2p.types.tasks import ChatMessage, GenerationParams  # noqa: E402
from tests.support.batch_drive import CHUNK, requests  # noqa: E402
from worker.engine.builder import build_engine  # noqa: E402
from worker.engine.scheduler import Engine  # noqa: E402

Request = tuple[str, GenerationParams]

PROMPT = "and the cat sat on the mat, the cat sat on the mat"


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from tests.support.models.synthetic_models import make_synthetic_model
    from worker.engine.loading.loader import load_all

    return load_all(make_synthetic_model(tmp_path_factory.mktemp("bresume") / "synthetic", n_layers=4))


def _params(**fields) -> GenerationParams:
    return GenerationParams(messages=(ChatMessage("user", PROMPT),), **fields)


def _run(gen: Engine, reqs: list[Request], task_id: str):
    """Submit ``reqs`` (task id, parameters), step until idle; the token chunks and the end
    chunk of ``task_id``."""
    for r in reqs:
        gen.submit(*r)
    tokens, ends = [], []
    for _ in range(20_000):
        if not gen.has_work():
            break
        for chunk in gen.step():
            if chunk.task_id != task_id:
                continue
            if isinstance(chunk, TokenChunk):
                tokens.append(chunk)
            elif isinstance(chunk, (FinishChunk, ErrorChunk)):
                ends.append(chunk)
    else:
        raise AssertionError("engine still busy")
    assert len(ends) == 1
    return tokens, ends[0]


@pytest.mark.parametrize("fields", [
    {"temperature": 0},
    {"temperature": 1.1, "seed": 7},
    {"temperature": 0, "stop": ("the", "mat")},
])
@pytest.mark.parametrize("cut", [1, 9])
def test_resumed_in_a_batch_equals_the_uninterrupted_run(loaded, fields: dict, cut: int) -> None:
    """The uninterrupted run is alone on the one-at-a-time path; the resumed one joins a batch
    of six other requests (some before it, some after), ``max_batch`` 16."""
    first = ("first", _params(max_tokens=24, **fields))
    full, full_end = _run(build_engine(loaded, EngineSettings(prefill_chunk_size=CHUNK, max_batch=1)), [first], "first")
    assert isinstance(full_end, FinishChunk) and len(full) > cut
    sent = tuple(c.token_id for c in full[:cut])
    moved = ("second", _params(max_tokens=24, resume_tokens=sent, origin_task_id="first", **fields))
    others = requests(6)
    batched = build_engine(loaded, EngineSettings(prefill_chunk_size=CHUNK, max_batch=16))
    rest, end = _run(batched, [*others[:3], moved, *others[3:]], "second")
    assert isinstance(end, FinishChunk), end
    assert [(c.text, c.completion_tokens, c.token_id) for c in rest] == [
        (c.text, c.completion_tokens, c.token_id) for c in full[cut:]]
    assert (end.finish_reason, end.prompt_tokens, end.completion_tokens, end.stop_sequence) == (
        full_end.finish_reason, full_end.prompt_tokens, full_end.completion_tokens, full_end.stop_sequence)


def test_resume_after_the_last_allowed_token_only_finishes_in_a_batch(loaded) -> None:
    first = ("first", _params(max_tokens=6, temperature=0))
    full, full_end = _run(build_engine(loaded, EngineSettings(prefill_chunk_size=CHUNK, max_batch=1)), [first], "first")
    assert full_end.finish_reason == "length"
    moved = ("second", _params(max_tokens=6, temperature=0, resume_tokens=tuple(c.token_id for c in full),
                               origin_task_id="first"))
    gen = Engine(loaded, EngineSettings(prefill_chunk_size=CHUNK, max_batch=16), kv_capacity_tokens=10_000)
    rest, end = _run(gen, [requests(2)[0], moved, requests(2)[1]], "second")
    assert rest == [] and isinstance(end, FinishChunk)
    assert (end.finish_reason, end.completion_tokens) == ("length", 6)
    assert gen.batch_size == 0 and not gen.batch.holds_kv
