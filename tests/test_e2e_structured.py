"""Structured output with the embedded model (SmolLM2-135M) on a real node: eight schemas
(nested objects, arrays with ``minItems``/``maxItems``, ``enum``, ``anyOf``, ``$ref``/``$defs``,
``pattern``, required and optional properties, numbers with bounds) asked at once, through
OpenAI chat, Anthropic Messages and Ollama chat in turn; every answer that ended with
``stop`` parses and validates (``jsonschema``). Slow on CPU: one batch, short answers.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import pytest

from tests.conftest import EMBEDDED_MODEL

pytestmark = pytest.mark.e2e
anthropic = pytest.importorskip("anthropic")
ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")

MAX = 96
"""Tokens per answer: every schema's answer fits in fewer (strings are bounded), but a
number's digits are not, so a few may end with ``length``."""


def obj(required: list[str] | None = None, **props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


def text(n: int) -> dict[str, Any]:
    return {"type": "string", "maxLength": n}


POINT = obj(x={"type": "integer", "minimum": -10, "maximum": 10}, y={"type": "integer", "minimum": -10, "maximum": 10})
CASES: list[tuple[str, dict[str, Any]]] = [
    ("Describe a person and where they live.", obj(person=obj(name=text(16), address=obj(city=text(16), zip=text(5))))),
    ("List two or three colours.", obj(colors={"type": "array", "items": text(10), "minItems": 2, "maxItems": 3})),
    ("How do you feel today, from 1 to 5?", obj(mood={"enum": ["happy", "sad", "angry"]},
                                                 level={"type": "integer", "minimum": 1, "maximum": 5})),
    ("What is 7 times 6?", obj(answer={"anyOf": [{"type": "integer", "minimum": 0, "maximum": 100}, text(12)]})),
    ("Give a line from one point to another.", {"$defs": {"point": POINT}, **obj(start={"$ref": "#/$defs/point"},
                                                                                end={"$ref": "#/$defs/point"})}),
    ("Make up a flight code.", obj(code={"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"})),
    ("Name a film you like.", obj(["title"], title=text(24), year={"type": "integer", "minimum": 1900, "maximum": 2030},
                                  rating={"type": "integer", "minimum": 0, "maximum": 10})),
    ("What is the weather like?", obj(celsius={"type": "number", "minimum": -50, "maximum": 60},
                                      humidity={"type": "number", "exclusiveMinimum": 0, "maximum": 100})),
]


def ask(url: str, i: int, prompt: str, schema: dict[str, Any]) -> tuple[str, str]:
    """``(text, finish)`` of the greedy answer, through OpenAI chat, Anthropic or Ollama by turn;
    ``finish`` in OpenAI's words."""
    msgs = [{"role": "user", "content": prompt}]
    if i % 3 == 0:
        oc = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
        out = oc.chat.completions.create(model=EMBEDDED_MODEL, messages=msgs, temperature=0, max_tokens=MAX, response_format={
            "type": "json_schema", "json_schema": {"name": f"case{i}", "schema": schema, "strict": True}})
        return out.choices[0].message.content, out.choices[0].finish_reason
    if i % 3 == 1:
        ac = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=600)
        message = ac.messages.create(model=EMBEDDED_MODEL, max_tokens=MAX, messages=msgs, extra_body={"temperature": 0},
                                     output_config={"format": {"type": "json_schema", "schema": schema}})
        return message.content[0].text, "length" if message.stop_reason == "max_tokens" else "stop"
    answer = ollama.Client(host=url, timeout=600).chat(model=EMBEDDED_MODEL, messages=msgs, format=schema,
                                                       options={"temperature": 0, "num_predict": MAX})
    return answer.message.content, answer.done_reason


@pytest.mark.timeout(600)  # the node's start and load (~30 s) and one batch of 8 x 96 tokens (~60 s alone)
def test_every_answer_that_stops_validates_against_its_schema(embedded_node) -> None:
    with ThreadPoolExecutor(len(CASES)) as pool:
        answers = list(pool.map(lambda c: ask(embedded_node.url, c[0], *c[1]), enumerate(CASES)))
    stopped = 0
    for (prompt, schema), (answer, finish) in zip(CASES, answers):
        print(f"\n{finish:6} {prompt} -> {answer}")
        if finish == "stop":
            jsonschema.validate(json.loads(answer), schema)
            stopped += 1
        else:
            assert finish == "length" and answer.startswith("{"), (finish, answer)
    assert stopped >= len(CASES) - 2, f"only {stopped} of {len(CASES)} answers ended with stop"
