"""Encoded prompts kept per text encoder (``worker.image.prompts``, docs/images.md#speed): a
prompt seen again skips the encoder and gives the same pixels; the cache is bounded."""

from __future__ import annotations

import pytest

from tests.support.image_oracle import oracle_png, pixels, tiny_checkpoint

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory):
    from worker.image.load import load_pipeline

    ckpt = tiny_checkpoint(tmp_path_factory)
    return ckpt, load_pipeline(ckpt)


class _Counting:
    """``pipeline`` whose ``_encode_prompt_pair`` counts its calls."""

    def __init__(self, pipeline) -> None:
        self.inner, self.calls, self.text_encoder = pipeline, [], pipeline.text_encoder

    def _encode_prompt_pair(self, **kw):
        self.calls.append(kw["prompt"])
        return self.inner._encode_prompt_pair(**kw)


def test_a_prompt_seen_again_is_not_encoded_again_and_the_cache_is_bounded(pipeline) -> None:
    from worker.image.prompts import prompt_pair

    counting = _Counting(pipeline[1])
    first = prompt_pair(counting, "a red fox", 1.0, entries=2)
    assert prompt_pair(counting, "a red fox", 1.0, entries=2)[0] is first[0]
    prompt_pair(counting, "a blue jay", 1.0, entries=2)
    prompt_pair(counting, "a grey owl", 1.0, entries=2)  # drops the fox (least recently used)
    prompt_pair(counting, "a red fox", 1.0, entries=2)
    assert counting.calls == ["a red fox", "a blue jay", "a grey owl", "a red fox"]


def test_images_from_a_kept_encoding_equal_mflux(pipeline) -> None:
    from worker.image.denoise import ImageRun
    from worker.image.work import png

    ckpt, pipe = pipeline
    want = oracle_png(ckpt, prompt="a lighthouse", seed=3, steps=2, width=32, height=32)
    for _ in range(2):  # the second run takes the kept encoding
        run = ImageRun(pipe, prompt="a lighthouse", seed=3, steps=2, width=32, height=32)
        while not run.finished:
            run.step()
        assert pixels(png(run.image())) == pixels(want)
