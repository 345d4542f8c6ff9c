"""Images through a real node serving the tiny random Qwen2-VL: the openai client (chat and
Responses), anthropic and ollama (chat and generate), a PNG and a JPEG, streamed and not,
each answer equal to mlx-vlm's own greedy ``generate`` in this process on the same
checkpoint, image and prompt; a second turn re-sending the image reports cached prompt
tokens; a text-only model asked about an image is still a 400 naming it, and bad images
(truncated, a 30000×30000 header, a GIF bomb) are 400s with the vision runner serving on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import NodeProcess
from tests.support.images.samples import b64, data_url, gif_bomb, huge_png_header, image_bytes, truncated_png
from tests.support.images.vlm_oracle import QUESTION, vlm_answer
from tests.support.models.synthetic_models import make_synthetic_model
from tests.support.models.synthetic_vlm import make_synthetic_vlm

pytestmark = pytest.mark.integration
anthropic = pytest.importorskip("anthropic")
ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")

MODEL, TEXT_MODEL = "tiny-vl", "tiny-text"
MAX = 10
PNG, JPEG = image_bytes("PNG", (72, 56), color=(30, 90, 200)), image_bytes("JPEG", (56, 84), color=(220, 120, 20))


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    models = tmp_path_factory.mktemp("models")
    make_synthetic_vlm(models / MODEL)
    make_synthetic_model(models / TEXT_MODEL, n_layers=1, hidden_size=32, intermediate_size=64, seed=3)
    n = NodeProcess(tmp_path_factory.mktemp("node"), extra_args=["--models-dir", str(models)])
    try:
        n.start()
        n.place_and_wait(MODEL, timeout=180)
        n.models_dir = models  # type: ignore[attr-defined]
        yield n
    finally:
        n.stop()


def oracle(model_dir: Path, image: bytes) -> str:
    """mlx-vlm's greedy answer to QUESTION about ``image`` (``tests.support.images.vlm_oracle``)."""
    return vlm_answer(model_dir, image, MAX, QUESTION)


def answers(url: str, image: bytes, media_type: str) -> dict[str, str]:
    """The node's answer through each family's official client, streamed and not."""
    oc = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    ac = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)
    lc = ollama.Client(host=url, timeout=120)
    chat = [{"role": "user", "content": [{"type": "text", "text": QUESTION},
                                         {"type": "image_url", "image_url": {"url": data_url(image, media_type)}}]}]
    responses = [{"role": "user", "content": [{"type": "input_text", "text": QUESTION},
                                              {"type": "input_image", "image_url": data_url(image, media_type), "detail": "auto"}]}]
    blocks = [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": media_type, "data": b64(image)}},
                                           {"type": "text", "text": QUESTION}]}]
    options = {"temperature": 0, "num_predict": MAX}
    with ac.messages.stream(model=MODEL, max_tokens=MAX, messages=blocks, extra_body={"temperature": 0}) as stream:
        anthropic_streamed = "".join(stream.text_stream)
    return {
        "openai chat": oc.chat.completions.create(model=MODEL, messages=chat, temperature=0, max_tokens=MAX).choices[0].message.content,
        "openai chat stream": "".join(c.choices[0].delta.content or "" for c in oc.chat.completions.create(
            model=MODEL, messages=chat, temperature=0, max_tokens=MAX, stream=True) if c.choices),
        "openai responses": oc.responses.create(model=MODEL, input=responses, temperature=0, max_output_tokens=MAX).output_text,
        "anthropic": ac.messages.create(model=MODEL, max_tokens=MAX, messages=blocks, extra_body={"temperature": 0}).content[0].text,
        "anthropic stream": anthropic_streamed,
        "ollama chat": lc.chat(model=MODEL, messages=[{"role": "user", "content": QUESTION, "images": [image]}],
                               options=options).message.content,
        "ollama chat stream": "".join(p.message.content for p in lc.chat(
            model=MODEL, messages=[{"role": "user", "content": QUESTION, "images": [image]}], stream=True, options=options)),
        "ollama generate": lc.generate(model=MODEL, prompt=QUESTION, images=[image], options=options).response,
    }


@pytest.mark.parametrize(("image", "media_type"), [(PNG, "image/png"), (JPEG, "image/jpeg")], ids=["png", "jpeg"])
def test_every_family_answers_an_image_as_mlx_vlm_does(node: Any, image: bytes, media_type: str) -> None:
    expected = oracle(node.models_dir / MODEL, image)
    assert expected
    got = answers(node.url, image, media_type)
    assert got == dict.fromkeys(got, expected)


def test_a_second_turn_with_the_same_image_reports_cached_tokens(node: Any) -> None:
    oc = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=120)
    image = image_bytes("PNG", (64, 64), color=(10, 200, 90))
    first = {"role": "user", "content": [{"type": "text", "text": QUESTION},
                                         {"type": "image_url", "image_url": {"url": data_url(image)}}]}
    one = oc.chat.completions.create(model=MODEL, messages=[first], temperature=0, max_tokens=MAX)
    turn2 = [first, {"role": "assistant", "content": "A green square."}, {"role": "user", "content": "Sure?"}]
    two = oc.chat.completions.create(model=MODEL, messages=turn2, temperature=0, max_tokens=MAX)
    assert one.choices[0].message.content and two.choices[0].message.content is not None
    assert two.usage.prompt_tokens_details.cached_tokens > 0


def test_a_text_only_model_and_bad_images_are_400s_and_the_runner_serves_on(node: Any) -> None:
    oc = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=60)
    chat = [{"role": "user", "content": [{"type": "text", "text": QUESTION},
                                         {"type": "image_url", "image_url": {"url": data_url(PNG)}}]}]
    with pytest.raises(openai.BadRequestError, match="takes text only"):
        oc.chat.completions.create(model=TEXT_MODEL, messages=chat, max_tokens=MAX)
    for bad in (truncated_png(), huge_png_header(), gif_bomb()):  # refused by the API: never reach the runner
        part = {"type": "image_url", "image_url": {"url": data_url(bad)}}
        with pytest.raises(openai.BadRequestError):
            oc.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [part]}], max_tokens=MAX)
    text = oc.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=0, max_tokens=4)
    assert text.choices[0].finish_reason in ("stop", "length")


def test_an_image_among_8_streaming_text_rows_answers_the_same(node: Any) -> None:
    import threading

    expected = oracle(node.models_dir / MODEL, JPEG)
    errors: list[BaseException] = []

    def text(i: int) -> None:
        try:
            r = node.chat(f"count to {i} slowly", MODEL, max_tokens=40, temperature=0)
            assert r.status_code == 200, r.text
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=text, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    oc = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=120)
    chat = [{"role": "user", "content": [{"type": "text", "text": QUESTION},
                                         {"type": "image_url", "image_url": {"url": data_url(JPEG, "image/jpeg")}}]}]
    got = oc.chat.completions.create(model=MODEL, messages=chat, temperature=0, max_tokens=MAX).choices[0].message.content
    for t in threads:
        t.join(timeout=180)
    assert not errors and not any(t.is_alive() for t in threads), errors
    assert got == expected
