"""The chat's "Image" button against the real API app over the fake cluster: a picked PNG goes
with the next message as an OpenAI ``image_url`` data URL part after its text, shows as a
thumbnail in the conversation, the attachment is cleared once sent, and a model whose card
does not list ``vision`` answers the node's 400 naming it, shown under the answer."""

from __future__ import annotations

import base64

import pytest

from tests.dashboard.fake_backend import FakeCluster, ServedBackend, synthetic_state
from tests.support.images.samples import image_bytes

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
WAIT_MS = 30_000
"""Milliseconds a wait for the page may take: bounded only so a hang fails."""


def test_an_attached_image_goes_with_the_message(page, tmp_path) -> None:  # noqa: ANN001
    server = ServedBackend(FakeCluster(synthetic_state(8))).start()
    try:
        data = image_bytes("PNG", (16, 16))
        (tmp_path / "dot.png").write_bytes(data)
        page.goto(server.url + "/")
        page.wait_for_function("document.querySelector('#chat-model').value !== ''", timeout=WAIT_MS)
        page.set_input_files("#chat-image", str(tmp_path / "dot.png"))
        page.wait_for_function("document.querySelector('#chat-image-name').textContent.includes('dot.png')", timeout=WAIT_MS)
        page.fill("#chat-input", "what is this?")
        with page.expect_request("**/v1/chat/completions", timeout=WAIT_MS) as request:
            page.click("#chat-send")
        text, part = request.value.post_data_json["messages"][-1]["content"]
        assert text == {"type": "text", "text": "what is this?"}
        assert part == {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}
        page.wait_for_function("!document.querySelector('#chat-log .msg.assistant.streaming')", timeout=WAIT_MS)
        assert "takes text only" in page.locator("#chat-log .msg.assistant .error").last.inner_text()
        assert page.locator("#chat-log .msg.user img.chat-thumb").count() == 1
        assert page.locator("#chat-image-name").inner_text() == ""  # sent: the attachment is cleared
    finally:
        server.close()
