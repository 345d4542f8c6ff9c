"""Structured output on real node processes with a tiny synthetic model: every API family
through its official client (``openai`` chat, completions, Responses, their ``parse`` and
``stream`` helpers; ``anthropic``; ``ollama``), streamed and not, answers text that validates against the
schema (``jsonschema``) and ends with ``stop``, the same greedy text through every chat
family; the extensions ``regex`` and ``grammar``; bad formats are a 400 with llguidance's
message through each client; in a batch of 8 mixed constrained and free requests the free
ones equal their solo answers; a 2-node pipeline instance answers as a 1-node one (a forced
tool call too, in the batch and on the pipeline).
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import httpx
import jsonschema
import pytest

from tests.support.cluster import NodeProcess, converged, nodes_cleanup, wait_until
from tests.conftest import tiny_models_dir

pytestmark = pytest.mark.integration
anthropic = pytest.importorskip("anthropic")
ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")

MODEL = "tiny-structured"
MAX = 200
"""Tokens enough for every schema here: their strings, arrays and numbers are bounded, and
JSON is compiled without free whitespace, so each ends with ``stop`` within it."""
MSGS = [{"role": "user", "content": "describe a person"}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
        "home": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}}, "required": ["city"],
                 "additionalProperties": False},
    },
    "required": ["name", "age", "tags", "home"],
    "additionalProperties": False,
}
OPENAI_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


class Pet(pydantic.BaseModel):
    """What the SDKs' ``parse`` helpers turn into a schema (strict: every field required).
    Enums and booleans only: Anthropic's SDK moves bounds of strings and numbers into
    descriptions, and a random model's unbounded string never ends."""

    kind: Literal["cat", "dog"]
    size: Literal["s", "m", "l"]
    good: bool


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two nodes of one cluster; a 1-node instance of the tiny model placed."""
    models = tiny_models_dir(tmp_path_factory, MODEL, n_layers=4, hidden_size=64, intermediate_size=128, seed=21)
    args = ["--models-dir", str(models), "--max-batch", "8"]
    a = NodeProcess(tmp_path_factory.mktemp("a"), extra_args=args)
    nodes = [a]
    with nodes_cleanup(nodes):
        a.start()
        boot = [x for addr in a.addrs() for x in ("--bootstrap", addr)]
        b = NodeProcess(tmp_path_factory.mktemp("b"), cluster=a.cluster, extra_args=[*args, *boot])
        nodes.append(b)
        b.start()
        wait_until(lambda: converged(nodes, 2), 30, what="2-node cluster")
        a.place_and_wait(MODEL, timeout=120, min_nodes=1)
        yield a, b


def clients(url: str) -> tuple[Any, Any, Any]:
    return (openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120),
            anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120),
            ollama.Client(host=url, timeout=120))


def valid(text: str, schema: dict, finish: str) -> str:
    """``text`` after checking it ended with ``stop`` and validates against ``schema``."""
    assert finish in ("stop", "end_turn", "completed"), (finish, text)
    jsonschema.validate(json.loads(text), schema)
    return text


def openai_answers(oc: Any) -> dict[str, str]:
    chat = oc.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=MAX, response_format=OPENAI_FORMAT)
    streamed, finish = [], None
    for event in oc.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=MAX,
                                            response_format=OPENAI_FORMAT, stream=True):
        streamed += [c.delta.content or "" for c in event.choices]
        finish = next((c.finish_reason for c in event.choices if c.finish_reason), finish)
    text_format = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    response = oc.responses.create(model=MODEL, input=MSGS[0]["content"], temperature=0, max_output_tokens=MAX,
                                   text={"format": text_format})
    deltas, status = [], None
    for event in oc.responses.create(model=MODEL, input=MSGS[0]["content"], temperature=0, max_output_tokens=MAX,
                                     text={"format": text_format}, stream=True):
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type in ("response.completed", "response.incomplete"):
            status = event.response.status
    return {
        "openai chat": valid(chat.choices[0].message.content, PERSON, chat.choices[0].finish_reason),
        "openai chat stream": valid("".join(streamed), PERSON, finish),
        "openai responses": valid(response.output_text, PERSON, response.status),
        "openai responses stream": valid("".join(deltas), PERSON, status),
    }


def other_answers(ac: Any, lc: Any) -> dict[str, str]:
    fmt = {"format": {"type": "json_schema", "schema": PERSON}}
    message = ac.messages.create(model=MODEL, max_tokens=MAX, messages=MSGS, output_config=fmt, extra_body={"temperature": 0})
    with ac.messages.stream(model=MODEL, max_tokens=MAX, messages=MSGS, output_config=fmt, extra_body={"temperature": 0}) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    options = {"temperature": 0, "num_predict": MAX}
    chat = lc.chat(model=MODEL, messages=MSGS, format=PERSON, options=options)
    parts = list(lc.chat(model=MODEL, messages=MSGS, format=PERSON, options=options, stream=True))
    return {
        "anthropic": valid(message.content[0].text, PERSON, message.stop_reason),
        "anthropic stream": valid(streamed, PERSON, final.stop_reason),
        "ollama chat": valid(chat.message.content, PERSON, chat.done_reason),
        "ollama chat stream": valid("".join(p.message.content for p in parts), PERSON, parts[-1].done_reason),
    }


def test_every_family_answers_valid_json_through_its_official_client_streamed_and_not(pair) -> None:
    a, _b = pair
    oc, ac, lc = clients(a.url)
    answers = {**openai_answers(oc), **other_answers(ac, lc)}
    reference = answers["openai chat"]
    assert answers == dict.fromkeys(answers, reference)  # one prompt, one greedy constrained answer
    # completions: a raw prompt (the chat template's text), response_format as vLLM takes it
    raw = f"<|im_start|>user\n{MSGS[0]['content']}<|im_end|>\n<|im_start|>assistant\n"
    done = oc.completions.create(model=MODEL, prompt=raw, temperature=0, max_tokens=MAX, extra_body={"response_format": OPENAI_FORMAT})
    assert valid(done.choices[0].text, PERSON, done.choices[0].finish_reason) == reference
    pieces = list(oc.completions.create(model=MODEL, prompt=raw, temperature=0, max_tokens=MAX, stream=True,
                                        extra_body={"response_format": OPENAI_FORMAT}))
    assert "".join(p.choices[0].text for p in pieces if p.choices) == reference
    generated = lc.generate(model=MODEL, prompt=MSGS[0]["content"], format="json", options={"temperature": 0, "num_predict": MAX})
    check_format({"response_format": {"type": "json_object"}}, generated.response, generated.done_reason)


def test_the_sdks_parse_helpers_get_their_models_back(pair) -> None:
    a, _b = pair
    oc, ac, _lc = clients(a.url)
    msgs = [{"role": "user", "content": "a pet"}]
    parsed = oc.chat.completions.parse(model=MODEL, messages=msgs, temperature=0, max_tokens=MAX, response_format=Pet)
    assert isinstance(parsed.choices[0].message.parsed, Pet)
    response = oc.responses.parse(model=MODEL, input="a pet", temperature=0, max_output_tokens=MAX, text_format=Pet)
    assert isinstance(response.output_parsed, Pet)
    message = ac.messages.parse(model=MODEL, max_tokens=MAX, messages=msgs, output_format=Pet, extra_body={"temperature": 0})
    assert isinstance(message.parsed_output, Pet)
    # the streaming helpers, which parse the whole answer at its end
    with oc.chat.completions.stream(model=MODEL, messages=msgs, temperature=0, max_tokens=MAX, response_format=Pet) as stream:
        assert stream.get_final_completion().choices[0].message.parsed == parsed.choices[0].message.parsed
    with oc.responses.stream(model=MODEL, input="a pet", temperature=0, max_output_tokens=MAX, text_format=Pet) as stream:
        assert stream.get_final_response().output_parsed == response.output_parsed


def test_the_regex_and_grammar_extensions(pair) -> None:
    a, _b = pair
    oc, _ac, _lc = clients(a.url)
    chat = oc.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=MAX, extra_body={"regex": r"[0-9]{3}-[a-z]{2}"})
    assert chat.choices[0].finish_reason == "stop" and re.fullmatch(r"[0-9]{3}-[a-z]{2}", chat.choices[0].message.content)
    done = oc.completions.create(model=MODEL, prompt="answer:", temperature=0.9, seed=4, max_tokens=MAX,
                                 extra_body={"grammar": 'start: "yes" | "no" | "maybe " NUMBER\n%import common.NUMBER'})
    assert re.fullmatch(r"yes|no|maybe [0-9.eE+-]+", done.choices[0].text), done.choices[0].text
    for path, body in [("/v1/messages", {"max_tokens": MAX, "messages": MSGS, "regex": "(ab)+c"}),
                       ("/api/chat", {"messages": MSGS, "stream": False, "grammar": 'start: "x"+ "!"'})]:
        r = a.post(path, json={"model": MODEL, "temperature": 0, **body})
        assert r.status_code == 200, r.text
        text = r.json()["content"][0]["text"] if path == "/v1/messages" else r.json()["message"]["content"]
        assert re.fullmatch(r"(ab)+c|x+!", text), text


def test_bad_formats_are_a_400_with_llguidances_message_through_each_client(pair) -> None:
    a, _b = pair
    oc, ac, lc = clients(a.url)
    bad = {"type": "object", "properties": {"n": {"type": "nope"}}}
    with pytest.raises(openai.BadRequestError, match="Invalid type: nope") as err:
        oc.chat.completions.create(model=MODEL, messages=MSGS, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": bad}})
    assert err.value.body["param"] == "response_format.json_schema.schema"
    with pytest.raises(openai.BadRequestError, match="unknown name"):
        oc.completions.create(model=MODEL, prompt="x", extra_body={"grammar": "start: missing"})
    with pytest.raises(openai.BadRequestError, match=r"text\.format\.schema: Unimplemented keys"):
        oc.responses.create(model=MODEL, input="x", text={"format": {
            "type": "json_schema", "name": "x", "schema": {"type": "array", "uniqueItems": True}}})
    with pytest.raises(anthropic.BadRequestError, match=r"output_config\.format\.schema: .*unclosed group"):
        ac.messages.create(model=MODEL, max_tokens=8, messages=MSGS, output_config={"format": {
            "type": "json_schema", "schema": {"type": "string", "pattern": "(a"}}})
    with pytest.raises(ollama.ResponseError, match="format: Invalid type: nope") as oerr:
        lc.chat(model=MODEL, messages=MSGS, format={"type": "nope"})
    assert oerr.value.status_code == 400
    with pytest.raises(ollama.ResponseError, match="regex: .*unclosed"):
        a_generate_with(a, {"regex": "(x"})


def a_generate_with(node: NodeProcess, extra: dict) -> None:
    """``/api/generate`` with fields the ollama client does not send, its error raised as the client would."""
    r = node.post("/api/generate", json={"model": MODEL, "prompt": "x", "stream": False, **extra})
    if r.status_code >= 400:
        raise ollama.ResponseError(r.json()["error"], r.status_code)


FORMATS = [
    {"response_format": OPENAI_FORMAT},
    {"response_format": {"type": "json_object"}},
    {"regex": r"[a-f]{4}\.[0-9]{2}"},
    {"grammar": 'start: item ("," item)*\nitem: "ab" | "cd"'},
]


def chat(node: NodeProcess, content: str, max_tokens: int, **extra: Any) -> tuple[str, str]:
    r = node.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": content}],
                                                "temperature": 0, "max_tokens": max_tokens, **extra})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["message"]["content"], choice["finish_reason"]


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}}


def tool_chat(node: NodeProcess, content: str) -> tuple[list[tuple[str, str]], str]:
    """A call forced with ``tool_choice`` (the generic tool format: the synthetic model has no
    native one): the calls (name, arguments) and the finish reason."""
    r = node.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": content}],
                                                "temperature": 0, "max_tokens": 200, "tools": [TOOL],
                                                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                                                "parallel_tool_calls": False})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"].get("tool_calls") or []]
    # a second call that max_tokens cut comes back as text (a random model goes on calling)
    assert calls and calls[0][1] not in (choice["message"]["content"] or ""), choice
    for _name, arguments in calls:
        jsonschema.validate(json.loads(arguments), TOOL["function"]["parameters"])
    return calls, choice["finish_reason"]


def check_format(extra: dict, text: str, finish: str) -> None:
    """The answer matches its format; it ended with ``stop`` unless the format is any JSON
    object (unbounded: a random model's may be cut at ``max_tokens``, an object's start)."""
    if extra.get("response_format") == {"type": "json_object"} and finish == "length":
        assert text.startswith("{"), text
        return
    assert finish == "stop", (extra, text)
    if "response_format" in extra:
        schema = PERSON if extra["response_format"]["type"] == "json_schema" else {"type": "object"}
        jsonschema.validate(json.loads(text), schema)
    elif "regex" in extra:
        assert re.fullmatch(extra["regex"], text), text
    else:
        assert re.fullmatch(r"(ab|cd)(,(ab|cd))*", text), text


def test_a_batch_of_eight_mixed_rows_keeps_the_free_rows_solo_answers(pair) -> None:
    a, _b = pair
    free = [(f"tell me about {i} things", 40 + 10 * i) for i in range(4)]
    solo = [chat(a, content, n) for content, n in free]
    jobs = [(lambda c=c, n=n: chat(a, c, n)) for c, n in free]
    jobs += [(lambda e=e, i=i: chat(a, f"format {i}", MAX, **e)) for i, e in enumerate(FORMATS[:3])]
    tool_solo = tool_chat(a, "weather?")
    jobs.append(lambda: tool_chat(a, "weather?"))  # a forced tool call among them
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda job: job(), jobs))
    assert results[:4] == solo and results[-1] == tool_solo
    results = results[:-1]
    for extra, (text, finish) in zip(FORMATS, results[4:]):
        check_format(extra, text, finish)


def test_a_two_node_pipeline_answers_as_one_node(pair) -> None:
    a, b = pair
    one = [chat(a, f"format {i}", MAX, **e) for i, e in enumerate(FORMATS)]
    for extra, (text, finish) in zip(FORMATS, one):
        check_format(extra, text, finish)
    one_call = tool_chat(a, "weather in two places?")
    for instance in a.get("/instances").json():
        assert httpx.delete(a.url + f"/instances/{instance['instance_id']}", timeout=30).status_code == 200
    pipeline = a.place_and_wait(MODEL, timeout=120, min_nodes=2)
    assert len(pipeline["shards"]) == 2
    assert [chat(b, f"format {i}", MAX, **e) for i, e in enumerate(FORMATS)] == one
    assert tool_chat(b, "weather in two places?") == one_call  # tool calls too
