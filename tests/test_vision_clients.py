"""Images through each family's official client (openai chat and Responses, anthropic, ollama
chat and generate) against the real server and the fake backend: a text-only model asked
about a PNG or a JPEG is a 400 naming the model; truncated files, a 30000×30000 header, a GIF
bomb, too many images and URLs when URLs are off are 400s in the family's shape; nothing
reaches the cluster and the node answers text right after. Then URL fetching under
``--allow-image-urls`` against an image server on 127.0.0.1."""

from __future__ import annotations

import http.server
from typing import Any

import pytest
import trio

from exo_p2p.types import PlaceInstance
from exo_p2p.vision.fetch import ImageUrlPolicy
from exo_p2p.vision.image import MAX_IMAGE_BYTES
from tests.support.fake_master import MODEL, TOKENS, FakeMaster, run_served, submits
from tests.support.net.http_stub import serving
from tests.support.images.samples import b64, data_url, gif_bomb, huge_png_header, image_bytes, truncated_png

anthropic = pytest.importorskip("anthropic")
ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.integration
PNG, JPEG = image_bytes("PNG", (24, 24)), image_bytes("JPEG", (24, 24))


def _openai(url: str):  # noqa: ANN202
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=10)


def _anthropic(url: str):  # noqa: ANN202
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=10)


def _chat_image(url: str, image_url: str, stream: bool = False) -> Any:
    content = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": image_url}}]
    return _openai(url).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], stream=stream)


def _responses_image(url: str, image_url: str) -> Any:
    content = [{"type": "input_text", "text": "What is this?"}, {"type": "input_image", "image_url": image_url, "detail": "auto"}]
    return _openai(url).responses.create(model=MODEL, input=[{"role": "user", "content": content}])


def _anthropic_image(url: str, source: dict, stream: bool = False) -> Any:
    content = [{"type": "image", "source": source}, {"type": "text", "text": "What is this?"}]
    messages = [{"role": "user", "content": content}]
    if stream:
        with _anthropic(url).messages.stream(model=MODEL, max_tokens=8, messages=messages) as s:
            return "".join(s.text_stream)
    return _anthropic(url).messages.create(model=MODEL, max_tokens=8, messages=messages)


def _ollama(url: str):  # noqa: ANN202
    return ollama.Client(host=url, timeout=10)


def _error(call) -> tuple[int, str]:  # noqa: ANN001 - a client call expected to fail
    try:
        call()
    except (openai.APIStatusError, anthropic.APIStatusError) as exc:
        return exc.status_code, str(exc)
    except ollama.ResponseError as exc:
        return exc.status_code, exc.error
    raise AssertionError("the call succeeded")


CASES = {
    "openai chat png": lambda u: _chat_image(u, data_url(PNG)),
    "openai chat jpeg streamed": lambda u: _chat_image(u, data_url(JPEG, "image/jpeg"), stream=True),
    "responses jpeg": lambda u: _responses_image(u, data_url(JPEG, "image/jpeg")),
    "anthropic png": lambda u: _anthropic_image(u, {"type": "base64", "media_type": "image/png", "data": b64(PNG)}),
    "anthropic jpeg streamed": lambda u: _anthropic_image(u, {"type": "base64", "media_type": "image/jpeg", "data": b64(JPEG)}, True),
    "ollama chat png": lambda u: _ollama(u).chat(model=MODEL, messages=[{"role": "user", "content": "what?", "images": [PNG]}]),
    "ollama generate jpeg": lambda u: _ollama(u).generate(model=MODEL, prompt="what?", images=[JPEG]),
}
BAD = {
    "truncated (openai)": (lambda u: _chat_image(u, data_url(truncated_png())), "truncated or corrupt"),
    "30000x30000 header (anthropic)": (lambda u: _anthropic_image(u, {"type": "base64", "media_type": "image/png",
                                                                       "data": b64(huge_png_header())}), "33554432 pixels"),
    "gif bomb (ollama)": (lambda u: _ollama(u).generate(model=MODEL, prompt="what?", images=[gif_bomb()]), "33554432 pixels"),
    "url when urls are off (responses)": (lambda u: _responses_image(u, "https://example.com/cat.png"), "--allow-image-urls"),
    "url when urls are off (anthropic)": (lambda u: _anthropic_image(u, {"type": "url", "url": "https://example.com/a.png"}),
                                          "--allow-image-urls"),
    "17 images (ollama chat)": (lambda u: _ollama(u).chat(model=MODEL, messages=[{"role": "user", "content": "x",
                                                                                    "images": [PNG] * 17}]), "at most 16"),
}


async def _placed(backend: FakeMaster) -> None:
    assert (await backend.command(PlaceInstance(command_id="c1", model_id=MODEL))).error is None


def test_every_family_refuses_images_to_a_text_only_model_and_bad_images_by_name() -> None:
    async def body(url: str, backend: FakeMaster) -> None:
        await _placed(backend)
        for name, call in CASES.items():
            status, message = await trio.to_thread.run_sync(_error, lambda: call(url))
            assert status == 400 and f"model '{MODEL}' takes text only" in message, (name, message)
        for name, (call, words) in BAD.items():
            status, message = await trio.to_thread.run_sync(_error, lambda: call(url))
            assert status == 400 and words in message, (name, message)
        assert submits(backend) == []  # nothing reached the cluster
        answer = await trio.to_thread.run_sync(lambda: _openai(url).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "text alone"}]))
        assert answer.choices[0].message.content == "".join(TOKENS)  # the node is unharmed

    run_served(body)


class _Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/moved.png":
            self.send_response(302)
            self.send_header("Location", "/cat.png")
            self.end_headers()
            return
        body = PNG if self.path == "/cat.png" else b"\x89PNG" + b"\x00" * (MAX_IMAGE_BYTES + 1)
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("allow_private", [True, False])
def test_image_urls_are_fetched_only_when_allowed_and_bounded(allow_private: bool) -> None:
    with serving(_Images) as images:
        async def body(url: str, backend: FakeMaster) -> None:
            await _placed(backend)
            seen = {path: await trio.to_thread.run_sync(_error, lambda: _chat_image(url, f"{images}{path}"))
                    for path in ("/cat.png", "/moved.png", "/big.png")}
            if not allow_private:
                assert all(s == 400 and "loopback" in m for s, m in seen.values()), seen
                return
            assert "takes text only" in seen["/cat.png"][1], seen  # fetched, decoded, then refused for the model
            assert "HTTP 302" in seen["/moved.png"][1] and f"limit of {MAX_IMAGE_BYTES}" in seen["/big.png"][1], seen

        run_served(body, image_urls=ImageUrlPolicy(allow=True, allow_private=allow_private))


def test_anthropic_count_tokens_refuses_images_as_a_generation_would() -> None:
    def count(url: str) -> Any:
        content = [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}},
                   {"type": "text", "text": "What is this?"}]
        return _anthropic(url).messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": content}])

    async def body(url: str, backend: FakeMaster) -> None:
        status, message = await trio.to_thread.run_sync(_error, lambda: count(url))
        assert status == 400 and f"model '{MODEL}' takes text only" in message, message

    run_served(body)
