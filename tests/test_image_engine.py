"""The image runner's engine (docs/images.md#steps): the final image equals mflux's, partial
images, cancellation within one step, bad input and a failing model as error chunks."""

from __future__ import annotations

import pytest

from exo_p2p.types import (
    Embedding,
    EmbeddingParams,
    ErrorChunk,
    FinishChunk,
    ImageChunk,
    ImageEdits,
    ImageGeneration,
    ImageParams,
)
from tests.support.image_oracle import oracle_edit_png, oracle_png, pixels, reference_png, tiny_checkpoint

pytestmark = pytest.mark.timeout(240)  # mflux compiles the transformer call on first use


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory):
    return tiny_checkpoint(tmp_path_factory)


@pytest.fixture(scope="module")
def engine(ckpt):
    from worker.image.engine import ImageEngine, run_maker
    from worker.image.load import load_pipeline

    return ImageEngine(run_maker(load_pipeline(ckpt)))


def _task(task_id: str, kind=ImageGeneration, **params) -> ImageGeneration:
    p = {"prompt": "a red fox", "width": 64, "height": 48, "steps": 3, "seed": 7, **params}
    return kind(task_id=task_id, instance_id="i", model_id="tiny", params=ImageParams(**p), api_node_id="n")


def _drain(engine, limit: int = 50) -> list:
    out: list = []
    for _ in range(limit):
        if not engine.has_work():
            return out
        out += engine.step()
    raise AssertionError("the engine did not finish its work in 50 steps")


def test_final_image_equals_mflux_and_partials_come_between(engine, ckpt) -> None:
    want = oracle_png(ckpt, prompt="a red fox", seed=7, steps=4, width=64, height=48)
    engine.submit(_task("t1", steps=4, partial_images=2))
    chunks = _drain(engine)
    images = [c for c in chunks if isinstance(c, ImageChunk)]
    assert [(c.partial, c.step, c.index) for c in images] == [(True, 1, 0), (True, 3, 1), (False, 4, 0)]
    assert pixels(images[-1].image) == pixels(want)
    assert pixels(images[0].image) != pixels(want)  # a partial is the noisier latents
    assert isinstance(chunks[-1], FinishChunk) and chunks[-1].finish_reason == "stop"
    assert chunks[-1].completion_tokens == 4 and images[-1].seconds > 0


def test_an_edit_equals_mflux_edit_pipeline(engine, ckpt, tmp_path) -> None:
    ref = reference_png()
    want = oracle_edit_png(ckpt, ref, prompt="make it blue", seed=3, steps=2, width=64, height=48, tmp=tmp_path)
    engine.submit(_task("e1", kind=ImageEdits, image=ref, prompt="make it blue", seed=3, steps=2))
    engine.submit(_task("g1", prompt="make it blue", seed=3, steps=2))
    finals = {c.task_id: c.image for c in _drain(engine) if isinstance(c, ImageChunk)}
    assert pixels(finals["e1"]) == pixels(want) and pixels(finals["g1"]) != pixels(want)


def test_cancel_stops_the_running_image_within_one_step(engine) -> None:
    engine.submit(_task("t2", steps=6))
    engine.submit(_task("t3", steps=2))
    assert engine.step() == []  # t2's first step
    engine.cancel("t2")
    engine.cancel("t3")
    chunks = engine.step()
    assert [(c.task_id, c.finish_reason, c.completion_tokens) for c in chunks] == [("t3", "cancelled", 0),
                                                                                  ("t2", "cancelled", 1)]
    assert not engine.has_work()


def test_bad_input_and_other_kinds_are_error_chunks(engine) -> None:
    engine.submit(_task("big", width=4096))
    engine.submit(_task("odd", width=50))
    engine.submit(Embedding(task_id="emb", instance_id="i", model_id="tiny", params=EmbeddingParams(inputs=((1,),)),
                            api_node_id="n"))
    chunks = _drain(engine)
    assert {c.task_id: (c.error.status, c.error.param or c.error.code) for c in chunks if isinstance(c, ErrorChunk)} == {
        "big": (400, "size"), "odd": (400, "size"), "emb": (400, "unsupported_task")}


class _Broken:
    done_steps, steps, finished = 0, 2, False

    def step(self) -> None:
        raise RuntimeError("device lost")


def test_a_failing_model_ends_its_task_with_an_error_and_goes_on() -> None:
    from worker.image.engine import ImageEngine

    engine = ImageEngine(lambda task: _Broken())
    engine.submit(_task("b1"))
    engine.submit(_task("b2"))
    chunks = _drain(engine)
    assert [(c.task_id, c.error.status) for c in chunks] == [("b1", 500), ("b2", 500)]
    assert "device lost" in chunks[0].error.message
