"""The dashboard chat with an image model (``static/chat_image.js``, docs/images.md#dashboard)
in headless chromium against a real node serving the tiny FLUX.2-klein checkpoint: the model
is offered in the chat; a message gets partial images while it denoises (dimmed), the step
count under it, then the final image — a PNG of the size asked — and the time it took; Stop
ends a running image and the node's task leaves State."""

from __future__ import annotations

import base64
import io
import shutil

import pytest

from tests.support.cluster import NodeProcess, wait_until
from tests.support.image_oracle import tiny_checkpoint

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(600)]
MODEL = "tiny-flux2"
WAIT_MS = 120_000
"""Milliseconds a wait for the page may take: a 256-pixel image of the tiny model takes
seconds a step on a loaded 2-core machine."""

WATCH = """() => {
  window.seen = { partials: 0, steps: [] };
  new MutationObserver(() => {
    if (document.querySelector('#chat-log img.generated.partial')) window.seen.partials += 1;
    const stats = document.querySelector('#chat-log .msg.assistant:last-child .stats');
    if (stats && stats.textContent.startsWith('step ') && !window.seen.steps.includes(stats.textContent))
      window.seen.steps.push(stats.textContent);
  }).observe(document.querySelector('#chat-log'), { childList: true, subtree: true, characterData: true });
}"""


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    shutil.copytree(tiny_checkpoint(tmp_path_factory), models / MODEL)
    n = NodeProcess(tmp_path_factory.mktemp("node"), extra_args=["--models-dir", str(models)])
    try:
        n.start()
        n.place_and_wait(MODEL, timeout=240)
        yield n
    finally:
        n.stop()


def _ask(page, node, prompt: str) -> None:
    page.goto(node.url + "/")
    page.wait_for_function(f"document.querySelector('#chat-model').value === '{MODEL}'", timeout=30_000)
    page.select_option("#chat-image-size", "256x256")
    page.evaluate(WATCH)
    page.fill("#chat-input", prompt)
    page.click("#chat-send")


def test_an_image_model_answers_with_partials_then_the_image(page, node) -> None:
    from PIL import Image

    _ask(page, node, "a lighthouse at dusk")
    page.wait_for_selector("#chat-log img.generated:not(.partial)", timeout=WAIT_MS)
    seen = page.evaluate("window.seen")
    assert seen["partials"] >= 1, seen  # 2 partial images asked, each shown as it came
    assert seen["steps"] and all(s.endswith(" of 4") for s in seen["steps"]), seen
    src = page.locator("#chat-log img.generated").last.get_attribute("src")
    assert src.startswith("data:image/png;base64,")
    with Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))) as im:
        assert im.size == (256, 256)
    stats = page.locator("#chat-log .msg.assistant .stats").last.inner_text()
    assert stats.startswith("image in"), stats
    assert page.locator("#chat-log .msg.user").last.inner_text().endswith("a lighthouse at dusk")


def test_stop_ends_a_running_image(page, node) -> None:
    page.goto(node.url + "/")
    page.wait_for_function(f"document.querySelector('#chat-model').value === '{MODEL}'", timeout=30_000)
    page.select_option("#chat-image-size", "1024x1024")  # long enough to stop midway
    page.fill("#chat-input", "a very large field")
    page.click("#chat-send")
    wait_until(lambda: any(node.get("/state").json()["tasks"]), 60, interval=0.1, what="the image task in State")
    page.click("#chat-stop")
    page.wait_for_function("!document.querySelector('#chat-log .msg.assistant.streaming')", timeout=30_000)
    assert page.locator("#chat-log .msg.assistant .stats").last.inner_text() == "stopped"
    wait_until(lambda: not any(node.get("/state").json()["tasks"]), 120, interval=0.2, what="the task to leave State")
