"""The vision path on the tiny random Qwen2-VL: features spliced into the input embeddings,
then greedy decode, equal to mlx-vlm's own ``generate`` for a PNG and a JPEG; a second
request with the same image reuses its features (``FeatureCache``), which stays bounded."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import mlx.core as mx
import pytest

from tests.support.images.samples import image_bytes
from tests.support.models.synthetic_vlm import make_synthetic_vlm
from worker.vision.features import FeatureCache
from worker.vision.greedy import greedy_tokens, vision_inputs

pytestmark = pytest.mark.unit
QUESTION = "What is in the picture?"


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    from mlx_vlm import load

    return load(str(make_synthetic_vlm(tmp_path_factory.mktemp("vlm") / "tiny-qwen2-vl")))


def _prompt(model, processor) -> str:  # noqa: ANN001
    from mlx_vlm.prompt_utils import apply_chat_template

    return apply_chat_template(processor, model.config, QUESTION, num_images=1)


def _oracle(model, processor, image: bytes, max_tokens: int) -> list[int]:  # noqa: ANN001
    from mlx_vlm import generate
    from PIL import Image

    result = generate(model, processor, _prompt(model, processor), image=[Image.open(io.BytesIO(image))],
                      max_tokens=max_tokens, temperature=0.0, verbose=False)
    return list(result.token_ids)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_tokens_equal_mlx_vlm_generate_and_features_are_reused(loaded, fmt: str) -> None:  # noqa: ANN001
    model, processor = loaded
    image = image_bytes(fmt, (72, 56), color=(30, 90, 200))
    expected = _oracle(model, processor, image, 12)
    cache = FeatureCache()
    inputs = vision_inputs(processor, model, _prompt(model, processor), [(hashlib.sha256(image).hexdigest(), image)])
    assert int((inputs.input_ids == model.config.image_token_id).sum().item()) > 1  # one token per feature
    assert greedy_tokens(model, inputs, 12, cache) == expected
    assert (cache.misses, cache.hits, len(cache)) == (1, 0, 1)
    assert greedy_tokens(model, inputs, 12, cache) == expected  # the second turn: features from the cache
    assert (cache.misses, cache.hits) == (1, 1)


def test_the_feature_cache_is_bounded_in_entries_and_bytes() -> None:
    cache = FeatureCache(max_entries=2, max_bytes=3 * 4 * 8)
    for name in ("a", "b", "c"):
        cache.put(name, mx.zeros((1, 8)))
    assert cache.get("a") is None and cache.get("c") is not None and len(cache) == 2
    cache.put("big", mx.zeros((2, 8)))  # 64 bytes: three entries, so the least recent ("b") goes
    assert cache.nbytes <= 96 and cache.get("b") is None and cache.get("big") is not None
    cache.put("huge", mx.zeros((4, 8)))  # 128 bytes > the bound: never kept
    assert cache.get("huge") is None and cache.nbytes <= 96
