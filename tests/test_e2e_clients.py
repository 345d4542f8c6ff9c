"""The official clients of every API family against one real node with the embedded model
(SmolLM2-135M, greedy Paris prompt). Slow: one node for the module, short answers; every
family must give the same greedy text as OpenAI chat completions.
"""

from __future__ import annotations

import pytest


pytestmark = pytest.mark.e2e
anthropic = pytest.importorskip("anthropic")
ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")

MODEL = "smollm2-135m-instruct"
QUESTION = "What is the capital of France?"
MAX = 12
MSGS = [{"role": "user", "content": QUESTION}]


@pytest.fixture(scope="module")
def node(embedded_node):  # type: ignore[no-untyped-def]
    """The node with the embedded model placed (``tests/conftest.py``)."""
    return embedded_node


@pytest.fixture(scope="module")
def reference(node) -> str:
    """The greedy answer through OpenAI chat completions."""
    client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=300)
    text = client.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=MAX).choices[0].message.content
    assert "Paris" in text
    return text


def test_anthropic_sdk_create_and_stream(node, reference) -> None:
    client = anthropic.Anthropic(base_url=node.url, api_key="unused", max_retries=0, timeout=300)
    message = client.messages.create(model=MODEL, max_tokens=MAX, messages=MSGS, extra_body={"temperature": 0})
    assert message.content[0].text == reference and message.usage.output_tokens <= MAX
    with client.messages.stream(model=MODEL, max_tokens=MAX, messages=MSGS, extra_body={"temperature": 0}) as stream:
        assert "".join(stream.text_stream) == reference
        assert stream.get_final_message().stop_reason in ("end_turn", "max_tokens")
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, max_tokens=MAX, messages=[{"role": "wizard", "content": "hi"}])


def test_ollama_client_chat_generate_list_ps_show(node, reference) -> None:
    client = ollama.Client(host=node.url, timeout=300)
    options = {"temperature": 0, "num_predict": MAX}
    chat = client.chat(model=MODEL, messages=MSGS, options=options)
    assert chat.message.content == reference and chat.done and chat.eval_count <= MAX
    assert "".join(p.message.content for p in client.chat(model=MODEL, messages=MSGS, options=options, stream=True)) == reference
    assert client.generate(model=MODEL, prompt=QUESTION, options=options).response == reference
    assert MODEL in [m.model for m in client.list().models]
    assert MODEL in [m.model for m in client.ps().models]
    assert client.show(MODEL).modelinfo["llama.context_length"] == 8192


def test_openai_responses_completions_and_model(node, reference) -> None:
    client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=300)
    assert client.responses.create(model=MODEL, input=QUESTION, temperature=0, max_output_tokens=MAX).output_text == reference
    events = list(client.responses.create(model=MODEL, input=QUESTION, temperature=0, max_output_tokens=MAX, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == reference
    assert events[-1].type in ("response.completed", "response.incomplete")
    completion = client.completions.create(model=MODEL, prompt="The capital of France is the city of", temperature=0, max_tokens=4)
    assert completion.choices[0].text.strip() and completion.usage.completion_tokens <= 4
    assert client.models.retrieve(MODEL).id == MODEL


def test_openai_logprobs_on_the_embedded_model(node, reference) -> None:
    """Greedy logprobs of the embedded model through the OpenAI SDK: each token is its own
    top alternative, the values are log-probabilities (≤ 0, the top 20's mass ≤ 1), the text
    is the reference answer, and a streamed run gives the same values (within 1e-4)."""
    import math

    client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=300)
    common = {"model": MODEL, "messages": MSGS, "temperature": 0, "max_tokens": MAX, "logprobs": True, "top_logprobs": 20}
    out = client.chat.completions.create(**common).choices[0]
    assert out.message.content == reference
    content = out.logprobs.content
    assert "".join(e.token for e in content).strip() == reference.strip()
    for e in content:
        assert len(e.top_logprobs) == 20 and e.top_logprobs[0].token == e.token
        assert abs(e.top_logprobs[0].logprob - e.logprob) <= 1e-6 and e.logprob <= 0
        assert sum(math.exp(t.logprob) for t in e.top_logprobs) <= 1 + 1e-4
    streamed = [e for c in client.chat.completions.create(**common, stream=True) if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert max(abs(a.logprob - b.logprob) for a, b in zip(streamed, content, strict=True)) <= 1e-4
