"""Per API family, a property over bodies drawn from the family's own request schemas (the
JSON Schema msgspec derives from each request Struct): no body within the size limit gets a
5xx, every error is in the family's shape, and every command the API sends stays within
``exo_p2p.api.bounds.MAX_COMMAND_BYTES``. Drawn values keep the schema's types and ranges most
of the time and leave them some of the time; strings near the command bound and stop lists
past their bound are drawn too. In process, with the fake backend of ``tests/test_api.py``
(whose models are ready, so no 5xx is due; no socket, no process: the unit tier)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import msgspec
import trio
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from exo_p2p.api import create_app
from exo_p2p.api.bounds import MAX_COMMAND_BYTES, MAX_STOP_BYTES, MAX_STOP_STRINGS
from exo_p2p.api.families.anthropic.messages import CountTokensRequest, MessagesRequest
from exo_p2p.api.families.ollama.generations import ChatRequest, GenerateRequest, ShowRequest
from exo_p2p.api.families.openai.completions import CompletionRequest
from exo_p2p.api.families.openai.responses import ResponsesRequest
from exo_p2p.api.schemas import ChatCompletionRequest

try:
    from tests.support.fake_master import MODEL, UNPLACED, FakeMaster, submits
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    from test_api import MODEL, UNPLACED, FakeMaster, submits  # type: ignore[no-redef]

MAX_BODY = 8 * 1024 * 1024
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20), st.sampled_from(["", "text", "user", MODEL, "\u2028", "9" * 5000, 10**400, -(10**400)]),
)
any_json = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                        max_leaves=12)
big_text = st.integers(MAX_COMMAND_BYTES - 2048, MAX_COMMAND_BYTES + 2048).map(lambda n: "x" * n)
stop_lists = st.lists(st.text(max_size=8) | st.integers(MAX_STOP_BYTES - 2, MAX_STOP_BYTES + 2).map(lambda n: "s" * n),
                      min_size=MAX_STOP_STRINGS - 1, max_size=MAX_STOP_STRINGS + 1)
OLLAMA_OPTIONS = ["temperature", "top_p", "top_k", "min_p", "num_predict", "stop", "seed", "repeat_penalty", "repeat_last_n",
                  "presence_penalty", "frequency_penalty", "mirostat", "tfs_z", "typical_p", "num_ctx"]
EXTRA = {
    "content": big_text, "prompt": big_text, "input": big_text, "system": big_text, "text": big_text,
    "stop": stop_lists, "stop_sequences": stop_lists,
    "logit_bias": st.dictionaries(st.text("0123456789", min_size=1, max_size=12) | st.just("9" * 5000), st.floats(-150, 150),
                                  max_size=4),
}  # fmt: skip
"""Other values drawn now and then besides the schema's for a property of this name, anywhere
in a body: near or past a bound."""
PREFERRED = {
    "role": st.sampled_from(["user", "user", "assistant", "system", "developer", "tool"]),
    "type": st.sampled_from(["text", "text", "input_text", "message", "image", "json_object"]),
    "options": st.fixed_dictionaries({}, optional={k: st.floats(-3, 3) | st.sampled_from([-1, 10**400, 1e308]) | any_json
                                                   for k in OLLAMA_OPTIONS}),
}
"""Values drawn mostly instead of the schema's for a property of this name: the schema says a
plain string or a free-form object there, the family reads these."""
ALWAYS = {"role", "content", "text"}
"""Properties drawn whenever an object has them (optional in the schema, needed to serve it)."""
MODELS = st.sampled_from([MODEL, MODEL, MODEL, UNPLACED, "no-such-model"]) | st.text(min_size=1, max_size=10)
"""The model of a body: the ready one mostly (the fake's ``LOADING`` model is left out: its
503 is due)."""


def from_schema(node: dict[str, Any], defs: dict[str, Any], name: str | None = None) -> st.SearchStrategy[Any]:
    """Values of the JSON Schema ``node`` (``$ref`` into ``defs``) for a property called
    ``name``: ``PREFERRED[name]`` mostly, ``EXTRA[name]`` one time in 6, and one time in 40
    any JSON value (most often of a wrong type)."""
    if "$ref" in node:
        return from_schema(defs[node["$ref"].rsplit("/", 1)[1]], defs, name)
    if name == "model":
        return MODELS
    if "anyOf" in node:
        drawn = st.one_of(*(from_schema(n, defs, name) for n in node["anyOf"]))
    elif "enum" in node:
        drawn = st.sampled_from(node["enum"])
    else:
        drawn = _typed(node, defs)
    if name in PREFERRED:
        drawn = _now_and_then(PREFERRED[name], drawn, 10)
    if name in EXTRA:
        drawn = _now_and_then(drawn, EXTRA[name], 6)
    return _now_and_then(drawn, any_json, 40)


def _now_and_then(main: st.SearchStrategy[Any], other: st.SearchStrategy[Any], one_in: int) -> st.SearchStrategy[Any]:
    """``other`` about one time in ``one_in``, ``main`` otherwise (the middle value picks
    ``other``: hypothesis draws the ends of a range far more often)."""
    return st.integers(0, one_in - 1).flatmap(lambda i: other if i == one_in // 2 else main)


def _typed(node: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy[Any]:
    kind = node.get("type")
    if kind is None:
        return any_json
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind in ("integer", "number"):
        low = node.get("minimum", node.get("exclusiveMinimum"))
        high = node.get("maximum", node.get("exclusiveMaximum"))
        if kind == "integer":
            return _now_and_then(st.integers(low, high), st.sampled_from([-1, 0, 2**31, 2**63, 10**30]), 10)
        return _now_and_then(st.floats(low, high, allow_nan=False), st.sampled_from([-1.0, 0.0, 3.0, 1e308]), 10)
    if kind == "string":
        return st.text(min_size=node.get("minLength", 0), max_size=min(node.get("maxLength", 30), 30))
    if kind == "array":
        items = from_schema(node["items"], defs) if "items" in node else any_json
        return _now_and_then(st.lists(items, min_size=1, max_size=4), st.just([]), 10)
    props = node.get("properties")
    if props is None:
        return st.dictionaries(st.text(max_size=8), any_json, max_size=4)
    required = set(node.get("required", ())) | (ALWAYS & set(props))
    fixed = st.fixed_dictionaries({k: from_schema(v, defs, k) for k, v in props.items() if k in required})
    optional = sorted(k for k in props if k not in required)
    if not optional:
        return fixed
    # a few optional fields at a time: with each one of a dozen drawn half the time, some
    # refused parameter would be set in nearly every body
    picked = st.lists(st.sampled_from(optional), max_size=4, unique=True).flatmap(
        lambda keys: st.fixed_dictionaries({k: from_schema(props[k], defs, k) for k in keys}))
    return st.tuples(fixed, picked).map(lambda pair: pair[0] | pair[1])


def bodies(schema_type: type) -> st.SearchStrategy[dict[str, Any]]:
    """Bodies from ``schema_type``'s JSON Schema (a required field is left out now and then)."""
    schema = msgspec.json.schema(schema_type)
    root = schema["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    drawn = _typed(root, schema["$defs"])
    required = sorted(root.get("required", ()))
    return st.tuples(drawn, _now_and_then(st.none(), st.sampled_from(required or [None]), 10)).map(
        lambda pair: {k: v for k, v in pair[0].items() if k != pair[1]})


def _shape_ok(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.request.url.path, response.status_code, response.text[:300])
    path = response.request.url.path
    if response.status_code >= 400:
        doc = response.json()
        if path.startswith("/api/"):
            assert set(doc) == {"error"} and isinstance(doc["error"], str)
        elif path.startswith("/v1/messages"):
            assert doc["type"] == "error" and set(doc["error"]) == {"type", "message"}
        else:
            assert set(doc["error"]) == {"message", "type", "param", "code"}
    elif response.headers["content-type"].startswith("application/json"):
        json.loads(response.content)
    else:  # a stream: whole events or lines, ended
        assert response.text.endswith("\n")


def run_requests(requests: list[tuple[str, dict[str, Any]]]) -> None:
    """POST each ``(path, body)`` to a fresh app; every answer checked by ``_shape_ok``, every
    command sent within the bound, and a good request still served at the end."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            backend = FakeMaster(nursery)
            transport = httpx.ASGITransport(app=create_app(backend, queue_limit=1))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                with trio.fail_after(60):
                    for path, body in requests:
                        data = json.dumps(body).encode()
                        assert len(data) <= MAX_BODY
                        r = await client.post(path, content=data, headers={"content-type": "application/json"})
                        event(f"{path} -> {r.status_code}")
                        _shape_ok(r)
                    good = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
                    assert (await client.post("/v1/chat/completions", json=good)).status_code == 200
                    assert all(len(msgspec.msgpack.encode(s)) <= MAX_COMMAND_BYTES for s in submits(backend))
                    assert not backend.channels
            nursery.cancel_scope.cancel()

    trio.run(main)


def family(endpoints: dict[str, type]) -> st.SearchStrategy[list[tuple[str, dict[str, Any]]]]:
    return st.lists(st.one_of(*(bodies(t).map(lambda b, p=p: (p, b)) for p, t in endpoints.items())), min_size=1, max_size=5)


SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SETTINGS
@given(family({"/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest,
               "/v1/responses": ResponsesRequest}))
# found by hypothesis: a prompt whose command fit the bound until the client's key was set
@example([("/v1/completions", {"model": MODEL, "prompt": "x" * 130810})])
def test_no_openai_body_within_the_size_limit_gets_a_5xx(requests: list[tuple[str, dict[str, Any]]]) -> None:
    run_requests(requests)


@SETTINGS
@given(family({"/v1/messages": MessagesRequest, "/v1/messages/count_tokens": CountTokensRequest}))
def test_no_anthropic_body_within_the_size_limit_gets_a_5xx(requests: list[tuple[str, dict[str, Any]]]) -> None:
    run_requests(requests)


@SETTINGS
@given(family({"/api/chat": ChatRequest, "/api/generate": GenerateRequest, "/api/show": ShowRequest}))
def test_no_ollama_body_within_the_size_limit_gets_a_5xx(requests: list[tuple[str, dict[str, Any]]]) -> None:
    run_requests(requests)
