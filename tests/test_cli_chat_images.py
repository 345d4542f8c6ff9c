"""``exo-p2p chat --image FILE`` against the fake node API (``tests/support/fake_node.py``):
the image goes as a data URL part with the question; a bad file is a CLI error naming it
before anything is sent."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from tests.support.fake_node import error_lines, invoke, served  # noqa: F401  (fixture)
from tests.support.fake_node import fast_polls  # noqa: F401  (autouse)
from tests.support.images.samples import image_bytes, truncated_png


def _chat_bodies(served) -> list[dict]:  # noqa: ANN001, F811
    return [b for m, p, _, b in served.node.requests if p == "/v1/chat/completions"]


@pytest.mark.integration
def test_chat_sends_the_image_with_the_question(served, tmp_path: Path) -> None:  # noqa: F811
    jpeg = tmp_path / "cat.jpg"
    jpeg.write_bytes(image_bytes("JPEG", (30, 20)))
    result = invoke(["chat", "What is this?", "--image", str(jpeg), "--api", served.url])
    assert result.exit_code == 0, result.output
    (body,) = _chat_bodies(served)
    text, part = body["messages"][-1]["content"]
    assert text == {"type": "text", "text": "What is this?"}
    head, data = part["image_url"]["url"].split(",", 1)
    assert head == "data:image/jpeg;base64" and base64.b64decode(data) == jpeg.read_bytes()


@pytest.mark.integration
def test_a_bad_image_file_is_a_cli_error_naming_it_and_nothing_is_sent(served, tmp_path: Path) -> None:  # noqa: F811
    broken = tmp_path / "broken.png"
    broken.write_bytes(truncated_png())
    for path, words in ((broken, "truncated or corrupt"), (tmp_path / "missing.png", "cannot read it")):
        result = invoke(["chat", "What is this?", "--image", str(path), "--api", served.url])
        assert result.exit_code == 2, result.output
        assert any(str(path) in line and words in line for line in error_lines(result)), result.output
    assert _chat_bodies(served) == []
