"""The dashboard chat's output format (``static/format.js``, the "Output format" field of
``static/chat.js``) in a browser, against the real API app over the synthetic State
(``fake_backend``): the pure function's cases; invalid JSON or a schema that is not an object
is shown in the page and nothing is sent; a valid one goes out as the OpenAI chat
``response_format``; and the answer streams while the backend received the format."""

from __future__ import annotations

import json

import httpx
import pytest

from exo_p2p.content.output_format import close_objects
from exo_p2p.types import SubmitTask
from tests.dashboard.fake_backend import TOKENS, FakeCluster, ServedBackend, synthetic_state

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
WAIT_MS = 30_000
SCHEMA = {"title": "the answer", "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}

JS_CASES = """
async () => {
  const f = await import('/dashboard/format.js');
  return {
    text: f.responseFormat('text', 'ignored'),
    object: f.responseFormat('json_object', ''),
    empty: f.responseFormat('json_schema', '  '),
    broken: f.responseFormat('json_schema', '{"type": '),
    array: f.responseFormat('json_schema', '[1]'),
    nul: f.responseFormat('json_schema', 'null'),
    number: f.responseFormat('json_schema', '3'),
    good: f.responseFormat('json_schema', '{"type": "object"}'),
    named: f.schemaName({title: 'A b/c'}),
  };
}
"""


class RecordingCluster(FakeCluster):
    """The fake backend, keeping each submitted generation's parameters."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.submitted: list = []

    async def command(self, command, timeout: float = 30.0):
        if isinstance(command, SubmitTask):
            self.submitted.append(command)
        return await super().command(command, timeout)


@pytest.fixture
def served():
    server = ServedBackend(RecordingCluster(synthetic_state(8), token_delay=0.02)).start()
    try:
        yield server
    finally:
        server.close()


def open_chat(page, url: str) -> list[dict]:
    """Open the page with a ready model in the chat; returns the list the chat requests'
    bodies are appended to."""
    sent: list[dict] = []
    page.on("request", lambda r: sent.append(json.loads(r.post_data or "{}")) if r.url.endswith("/v1/chat/completions") else None)
    page.goto(url + "/")
    page.wait_for_function("document.querySelector('#chat-send') && !document.querySelector('#chat-send').disabled",
                           timeout=WAIT_MS)
    return sent


def test_format_function_in_the_browser(page, served) -> None:
    page.goto(served.url + "/dashboard/index.html")
    out = page.evaluate(JS_CASES)
    assert out["text"] == {"format": None}
    assert out["object"] == {"format": {"type": "json_object"}}
    assert out["empty"]["error"].startswith("write a JSON schema")
    assert out["broken"]["error"].startswith("the schema is not valid JSON: ")
    assert out["array"] == {"error": "the schema is an array; a JSON schema is an object"}
    assert out["nul"] == {"error": "the schema is null; a JSON schema is an object"}
    assert out["number"] == {"error": "the schema is a number; a JSON schema is an object"}
    assert out["good"] == {"format": {"type": "json_schema", "json_schema": {
        "name": "schema", "schema": {"type": "object"}, "strict": True}}}
    assert out["named"] == "A_b_c"
    assert httpx.get(served.url + "/dashboard/format.js").status_code == 200


def test_an_invalid_schema_is_shown_and_nothing_is_sent(page, served) -> None:
    sent = open_chat(page, served.url)
    assert page.locator("#chat-format").evaluate("d => d.open") is False  # collapsed by default
    page.click("#chat-format summary")
    page.select_option("#chat-format-kind", "json_schema")
    assert page.locator("#chat-format summary").inner_text() == "Output format: JSON schema"
    page.fill("#chat-schema", '{"type": "object",')
    assert page.locator("#chat-format-error").inner_text().startswith("the schema is not valid JSON")
    page.click("#chat-format summary")  # collapse it: a send that fails opens it again
    page.fill("#chat-input", "a question")
    page.click("#chat-send")
    page.wait_for_function("document.querySelector('#chat-format').open", timeout=WAIT_MS)
    assert page.locator("#chat-format-error").is_visible()
    assert page.input_value("#chat-input") == "a question"  # kept for after the fix
    assert page.locator("#chat-log .msg").count() == 0 and sent == []
    page.fill("#chat-schema", "[]")
    assert page.locator("#chat-format-error").inner_text() == "the schema is an array; a JSON schema is an object"
    page.select_option("#chat-format-kind", "text")  # free text again: no error, nothing to check
    assert not page.locator("#chat-format-error").is_visible() and not page.locator("#chat-schema").is_visible()


def test_a_format_is_sent_as_response_format(page, served) -> None:
    sent = open_chat(page, served.url)
    page.click("#chat-format summary")
    page.select_option("#chat-format-kind", "json_schema")
    page.fill("#chat-schema", json.dumps(SCHEMA))
    assert not page.locator("#chat-format-error").is_visible()
    page.fill("#chat-input", "answer in JSON")
    page.click("#chat-send")
    page.wait_for_function("!document.querySelector('#chat-log .msg.assistant.streaming')", timeout=WAIT_MS)
    (body,) = sent
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "the_answer", "schema": SCHEMA, "strict": True}}
    page.select_option("#chat-format-kind", "json_object")
    page.fill("#chat-input", "any object")
    page.click("#chat-send")
    page.wait_for_function("!document.querySelector('#chat-log .msg.assistant.streaming')", timeout=WAIT_MS)
    assert sent[-1]["response_format"] == {"type": "json_object"}
    page.select_option("#chat-format-kind", "text")
    page.fill("#chat-input", "free")
    page.click("#chat-send")
    page.wait_for_function("!document.querySelector('#chat-log .msg.assistant.streaming')", timeout=WAIT_MS)
    assert "response_format" not in sent[-1] and len(sent) == 3


def test_the_answer_to_a_format_streams_in_the_page(page, served) -> None:
    open_chat(page, served.url)
    page.click("#chat-format summary")
    page.select_option("#chat-format-kind", "json_schema")
    page.fill("#chat-schema", json.dumps(SCHEMA))
    page.fill("#chat-input", "answer in JSON")
    page.click("#chat-send")
    page.wait_for_function("!document.querySelector('#chat-log .msg.assistant.streaming')", timeout=WAIT_MS)
    assert page.locator("#chat-log .msg.assistant .error").count() == 0
    assert page.locator("#chat-log .msg.assistant .content").last.inner_text() == "".join(TOKENS)
    fmt = served.backend.submitted[-1].params.output_format
    assert fmt is not None and fmt.kind == "json_schema" and json.loads(fmt.source) == close_objects(SCHEMA)  # objects closed (output_format)
    page.fill("#chat-schema", '{"type": "nope"}')  # JSON, an object: the node's 400 says what is wrong
    page.fill("#chat-input", "again")
    page.click("#chat-send")
    page.wait_for_function("!document.querySelector('#chat-log .msg.assistant.streaming')", timeout=WAIT_MS)
    assert "nope" in page.locator("#chat-log .msg.assistant .error").last.inner_text()
