"""Each API family's image shapes read into ``ChatMessage.images`` (OpenAI chat ``image_url``,
Responses ``input_image``, Anthropic ``image`` blocks, Ollama ``images``), the 400s of bad
images and URLs, the count bound checked before decoding, and the ``vision`` capability."""

from __future__ import annotations

import hashlib

import msgspec
import pytest

from exo_p2p.api.errors import ApiError
from exo_p2p.api.families.anthropic.messages import MessagesRequest, messages_params
from exo_p2p.api.families.ollama.params import ChatRequest, GenerateRequest, chat_params as ollama_chat, generate_params
from exo_p2p.api.families.openai.chat import chat_params
from exo_p2p.api.families.openai.responses import ResponsesRequest, responses_params
from exo_p2p.api.schemas import ChatCompletionRequest
from exo_p2p.api.views import model_entry
from exo_p2p.api.vision.admit import check_images
from exo_p2p.models.card.capabilities import model_capabilities
from exo_p2p.types import ChatMessage
from tests.support.fake_master import card
from tests.support.images.samples import b64, data_url, image_bytes, truncated_png

pytestmark = pytest.mark.unit

PNG = image_bytes("PNG", (20, 10))
JPEG = image_bytes("JPEG", (16, 16))
PNG_DIGEST = hashlib.sha256(PNG).hexdigest()


def decoded(type_, body: dict):  # noqa: ANN001, ANN201
    return msgspec.json.decode(msgspec.json.encode(body), type=type_)


def chat(content: list) -> ChatCompletionRequest:
    return decoded(ChatCompletionRequest, {"model": "m", "messages": [{"role": "user", "content": content}]})


def test_openai_chat_image_url_parts_become_the_message_images_in_order() -> None:
    params = chat_params(chat([{"type": "text", "text": "What is this?"},
                               {"type": "image_url", "image_url": {"url": data_url(PNG), "detail": "low"}},
                               {"type": "image_url", "image_url": {"url": data_url(JPEG, "image/jpeg")}}]))
    message = params.messages[0]
    assert message.content == "What is this?"
    assert [(i.media_type, i.width, i.height, i.size) for i in message.images] == [
        ("image/png", 20, 10, len(PNG)), ("image/jpeg", 16, 16, len(JPEG))]
    assert message.images[0].digest == PNG_DIGEST


def test_openai_chat_bad_images_and_urls_are_400s_naming_the_part() -> None:
    cases = [({"url": data_url(truncated_png())}, "truncated or corrupt"),
             ({"url": "https://example.com/cat.png"}, "--allow-image-urls"),
             ({"url": "data:text/plain;base64,aGk="}, "media type must be image"),
             ({}, "non-empty URL")]
    for image_url, words in cases:
        with pytest.raises(ApiError, match=words) as caught:
            chat_params(chat([{"type": "text", "text": "x"}, {"type": "image_url", "image_url": image_url}]))
        assert caught.value.info.status == 400 and caught.value.info.param == "messages[0].content[1].image_url"


def test_image_count_is_checked_before_any_image_is_decoded() -> None:
    parts = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,!!not-base64"}}] * 17
    with pytest.raises(ApiError, match="17 images in one request: at most 16") as caught:
        chat_params(chat(parts))
    assert caught.value.info.code == "too_many_images"
    with pytest.raises(ApiError, match="17 images"):
        ollama_chat(decoded(ChatRequest, {"model": "m", "messages": [{"role": "user", "content": "x", "images": ["!"] * 17}]}))


def test_responses_input_image_and_file_ids() -> None:
    body = {"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "Describe"}, {"type": "input_image", "image_url": data_url(PNG)}]}]}
    message = responses_params(decoded(ResponsesRequest, body)).messages[0]
    assert (message.content, message.images[0].digest) == ("Describe", PNG_DIGEST)
    body["input"][0]["content"][1] = {"type": "input_image", "file_id": "file-123"}
    with pytest.raises(ApiError, match="files are not stored here"):
        responses_params(decoded(ResponsesRequest, body))


def test_anthropic_image_blocks_base64_and_url_sources() -> None:
    def request(source: dict) -> MessagesRequest:
        return decoded(MessagesRequest, {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "image", "source": source}, {"type": "text", "text": "What is it?"}]}]})

    message = messages_params(request({"type": "base64", "media_type": "image/png", "data": b64(PNG)})).messages[0]
    assert (message.content, message.images[0].digest, message.images[0].media_type) == ("What is it?", PNG_DIGEST, "image/png")
    with pytest.raises(ApiError, match="--allow-image-urls") as caught:
        messages_params(request({"type": "url", "url": "https://example.com/a.png"}))
    assert caught.value.info.param == "messages.0.content[0].source.url"
    with pytest.raises(ApiError, match="media_type must be"):
        messages_params(request({"type": "base64", "media_type": "image/bmp", "data": b64(PNG)}))
    with pytest.raises(ApiError, match="not valid base64"):
        messages_params(request({"type": "base64", "media_type": "image/png", "data": "@@@@"}))


def test_ollama_images_on_chat_and_generate() -> None:
    params = ollama_chat(decoded(ChatRequest, {"model": "m", "messages": [{"role": "user", "content": "hi", "images": [b64(PNG)]}]}))
    assert params is not None and params.messages[0].images[0].digest == PNG_DIGEST
    params = generate_params(decoded(GenerateRequest, {"model": "m", "prompt": "hi", "images": [b64(JPEG)]}))
    assert params is not None and params.messages[-1].images[0].media_type == "image/jpeg"
    with pytest.raises(ApiError, match="raw prompt"):
        generate_params(decoded(GenerateRequest, {"model": "m", "prompt": "hi", "raw": True, "images": [b64(PNG)]}))
    with pytest.raises(ApiError, match="only user messages carry images"):
        ollama_chat(decoded(ChatRequest, {"model": "m", "messages": [{"role": "assistant", "content": "x", "images": [b64(PNG)]}]}))


def test_a_text_only_model_asked_about_an_image_is_a_400_naming_it() -> None:
    image = chat_params(chat([{"type": "image_url", "image_url": {"url": data_url(PNG)}}])).messages
    with pytest.raises(ApiError, match="model 'tiny-text' takes text only") as caught:
        check_images(card("tiny-text"), "tiny-text", image)
    assert (caught.value.info.status, caught.value.info.code) == (400, "model_not_vision")
    check_images(card("tiny-text"), "tiny-text", (ChatMessage("user", "text alone"),))
    vision = msgspec.structs.replace(card("tiny-vl"), capabilities=("completion", "vision"))
    check_images(vision, "tiny-vl", image)  # a vision model's runners read the image: admitted


def test_vision_capability_comes_from_the_config_and_shows_in_model_entries() -> None:
    assert model_capabilities(None, {"model_type": "qwen2_vl", "vision_config": {"depth": 2}}) == ("completion", "vision")
    assert model_capabilities(None, {"model_type": "llama"}) == ("completion",)
    vision = msgspec.structs.replace(card("tiny-vl"), capabilities=("completion", "vision"))
    assert model_entry(vision, 0).capabilities == ["completion", "vision"]


def test_anthropic_tool_results_carry_their_images_and_count_toward_the_bound() -> None:
    def request(result_blocks: list) -> MessagesRequest:
        return decoded(MessagesRequest, {"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": "Take a screenshot"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "shot", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result_blocks}]}]})

    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}}
    tool = messages_params(request([{"type": "text", "text": "here"}, image])).messages[-1]
    assert (tool.role, tool.content, tool.images[0].digest) == ("tool", "here", PNG_DIGEST)
    with pytest.raises(ApiError, match="17 images"):
        messages_params(request([{"type": "image", "source": {}}] * 17))
    with pytest.raises(ApiError, match="text and image blocks"):
        messages_params(request([{"type": "document"}]))
