"""Vision rows through the text engine's batch, in process, on the tiny random Qwen2-VL: the
image part's KV made by the vision engine (M-RoPE positions shifted by the row's delta), the
rest prefilled and decoded by the text engine; greedy tokens equal mlx-vlm's own ``generate``
for a PNG and a JPEG, alone and among 8 text rows; a second turn with the same image reuses
the prompt cache (cached tokens reported) while another image with the same token count does
not; a text-only request to the vision model is served as text; a missing image is a 503."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pytest

from exo_p2p.types import ChatMessage, ErrorChunk, FinishChunk, GenerationParams, ImageRef, TextGeneration, TokenChunk
from tests.support.images.samples import image_bytes
from tests.support.models.synthetic_vlm import make_synthetic_vlm
from worker.vision.inbox import RUNNER_IMAGES
from worker.vision.rows import render_prompt

pytestmark = pytest.mark.unit
QUESTION = "What is in the picture?"
MAX_STEPS = 400


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """(vision engine, mlx-vlm model, processor) over one checkpoint."""
    from mlx_vlm.utils import load as load_vlm

    from exo_p2p.types.engine import EngineSettings
    from worker.engine.builder import build_engine
    from worker.engine.loading.loader import LoadProgress, load_model
    from worker.engine.text import TextEngine
    from worker.vision.builder import share_language_model
    from worker.vision.engine import VisionEngine

    path = str(make_synthetic_vlm(tmp_path_factory.mktemp("vlm") / "tiny-qwen2-vl"))
    loaded = [item for item in load_model(path) if not isinstance(item, LoadProgress)][0]
    text = TextEngine(build_engine(loaded, EngineSettings(prompt_cache_bytes=64 * 1024 * 1024), model_id="tiny-vl"))
    vlm, processor = load_vlm(path)
    oracle_vlm, _ = load_vlm(path)  # its own weights, as mlx-vlm alone would hold them
    share_language_model(vlm, loaded.model)
    return VisionEngine(text, vlm, processor), oracle_vlm, processor


def _ref(data: bytes) -> ImageRef:
    digest = hashlib.sha256(data).hexdigest()
    RUNNER_IMAGES.put(digest, data)
    return ImageRef(digest=digest, media_type="image/png", width=1, height=1, size=len(data))


def _params(images: tuple[bytes, ...], text: str = QUESTION, history: tuple[ChatMessage, ...] = (), n: int = 10) -> GenerationParams:
    message = ChatMessage("user", text, images=tuple(_ref(i) for i in images))
    return GenerationParams(messages=(*history, message), max_tokens=n, temperature=0.0)


def _run(engine, tasks: dict[str, GenerationParams]) -> dict[str, tuple[list[int], FinishChunk | ErrorChunk]]:  # noqa: ANN001
    for task_id, params in tasks.items():
        engine.submit(TextGeneration(task_id, "i", "tiny-vl", params, "n"))  # type: ignore[arg-type]
    tokens: dict[str, list[int]] = {t: [] for t in tasks}
    ends: dict[str, FinishChunk | ErrorChunk] = {}
    for _ in range(MAX_STEPS):
        if len(ends) == len(tasks):
            break
        for chunk in engine.step():
            if isinstance(chunk, TokenChunk) and chunk.token_id is not None:
                tokens[chunk.task_id].append(chunk.token_id)
            elif isinstance(chunk, FinishChunk | ErrorChunk):
                ends[chunk.task_id] = chunk
    assert len(ends) == len(tasks), f"unfinished after {MAX_STEPS} steps"
    return {t: (tokens[t], ends[t]) for t in tasks}


def _oracle(vlm, processor, tokenizer, params: GenerationParams, images: tuple[bytes, ...]) -> list[int]:  # noqa: ANN001
    from mlx_vlm import generate
    from PIL import Image

    result = generate(vlm, processor, render_prompt(params, tokenizer), image=[Image.open(io.BytesIO(i)) for i in images],
                      max_tokens=params.max_tokens, temperature=0.0, verbose=False)
    return list(result.token_ids)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_a_vision_row_equals_mlx_vlm_alone_and_among_8_text_rows(parts, fmt: str) -> None:  # noqa: ANN001
    engine, oracle_vlm, processor = parts
    tokenizer = engine.text.engine.loaded.tokenizer
    image = image_bytes(fmt, (72, 56), color=(30, 90, 200))
    params = _params((image,), text=f"{fmt}: {QUESTION}")
    expected = _oracle(oracle_vlm, processor, tokenizer, params, (image,))
    tokens, end = _run(engine, {"alone": params})["alone"]
    assert isinstance(end, FinishChunk) and tokens == expected
    texts = {f"text{i}": GenerationParams(messages=(ChatMessage("user", f"Count to {i} please."),), max_tokens=10,
                                          temperature=0.0) for i in range(8)}
    alone = {t: r[0] for t, r in _run(engine, texts).items()}
    mixed = _run(engine, {**texts, "image": _params((image,), text=f"{fmt}: {QUESTION} ")})
    assert mixed["image"][0] == _oracle(oracle_vlm, processor, tokenizer, _params((image,), text=f"{fmt}: {QUESTION} "), (image,))
    assert {t: mixed[t][0] for t in texts} == alone


def test_the_same_image_hits_the_prompt_cache_and_another_image_does_not(parts) -> None:  # noqa: ANN001
    engine, oracle_vlm, processor = parts
    tokenizer = engine.text.engine.loaded.tokenizer
    first, other = image_bytes("PNG", (64, 64), color=(200, 30, 30)), image_bytes("PNG", (64, 64), color=(30, 200, 30))
    turn1 = _params((first,), text="Describe it.")
    answer1, _ = _run(engine, {"turn1": turn1})["turn1"]
    assert answer1  # the answer a client sends back is its own text (random tokens may spell special tokens)
    history = (turn1.messages[0], ChatMessage("assistant", "A red square."))
    turn2 = _params((), text="And its colour?", history=history)
    tokens2, end2 = _run(engine, {"turn2": turn2})["turn2"]
    assert isinstance(end2, FinishChunk) and end2.cached_tokens > 0
    assert tokens2 == _oracle(oracle_vlm, processor, tokenizer, turn2, (first,))
    swapped = _params((), text="And its colour?", history=(_params((other,), text="Describe it.").messages[0], history[1]))
    tokens3, end3 = _run(engine, {"turn3": swapped})["turn3"]
    assert isinstance(end3, FinishChunk) and end3.cached_tokens == 0  # same tokens, another image: no reuse
    assert tokens3 == _oracle(oracle_vlm, processor, tokenizer, swapped, (other,))


def test_text_alone_is_a_text_request_and_a_missing_image_is_a_503(parts) -> None:  # noqa: ANN001
    engine, _, _ = parts
    tokens, end = _run(engine, {"plain": GenerationParams(messages=(ChatMessage("user", "hello"),), max_tokens=5,
                                                          temperature=0.0)})["plain"]
    assert isinstance(end, FinishChunk) and len(tokens) >= 1
    gone = ImageRef(digest="0" * 64, media_type="image/png", width=1, height=1, size=1)
    params = GenerationParams(messages=(ChatMessage("user", "what?", images=(gone,)),), max_tokens=5)
    _, end = _run(engine, {"gone": params})["gone"]
    assert isinstance(end, ErrorChunk) and (end.error.status, end.error.code) == (503, "image_unavailable")


def test_a_tensor_instance_answers_images_501_and_serves_text(parts) -> None:  # noqa: ANN001
    from worker.vision.engine import VisionEngine

    tensor = VisionEngine(parts[0].text, None, None, multi=True)  # what VisionBuilder makes for tensor ranks
    data = image_bytes("PNG", (32, 32))
    _, end = _run(tensor, {"image": _params((data,))})["image"]
    assert isinstance(end, ErrorChunk) and (end.error.status, end.error.code) == (501, "vision_not_served")
    tokens, end = _run(tensor, {"text": GenerationParams(messages=(ChatMessage("user", "hi"),), max_tokens=3,
                                                         temperature=0.0)})["text"]
    assert isinstance(end, FinishChunk) and tokens
