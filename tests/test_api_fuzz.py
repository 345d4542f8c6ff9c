"""Hostile requests against every endpoint of the HTTP API (hypothesis).

Properties: no answer is a 5xx (with the fake backend every model is ready, so docs/architecture.md#instance-lifecycle
prescribes none), every error is OpenAI-shaped JSON, and after any sequence of hostile
requests the API still serves a good chat completion — with a queue limit of 1, so a
generation slot leaked by a bad request would show up as a 429.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import trio
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from exo_p2p.api import create_app
from exo_p2p.api.errors import family_of

try:
    from tests.support.fake_master import MODEL, FakeMaster, chat_body
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    from test_api import MODEL, FakeMaster, chat_body  # type: ignore[no-redef]

MAX_BODY = 8 * 1024 * 1024
ENDPOINTS = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/instances"),
    ("GET", "/instances"),
    ("GET", "/instances/previews"),
    ("GET", "/v1/models"),
    ("GET", "/models"),
    ("GET", "/state"),
    ("GET", "/nodes"),
    ("DELETE", "/instances/some-id"),
    ("GET", "/instances/some-id"),
    ("PUT", "/instances"),
    ("PATCH", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
    ("POST", "/api/chat"),
    ("POST", "/api/generate"),
    ("POST", "/api/show"),
    ("GET", "/api/tags"),
    ("GET", "/v1/models/some-model"),
]
JSON = {"content-type": "application/json"}
"""Bodies are sent as JSON so that they reach the routes (others are refused with 415)."""
WEIGHTED_ENDPOINTS = [ENDPOINTS[0]] * 6 + [ENDPOINTS[1]] * 2 + ENDPOINTS
"""Chat completions and placement take bodies, so they are drawn more often."""
CHAT_FIELDS = [
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed",
    "stream", "stream_options", "n", "tools", "tool_choice", "logprobs", "top_logprobs",
    "response_format", "logit_bias", "presence_penalty", "frequency_penalty", "audio", "modalities",
]  # fmt: skip
PLACE_FIELDS = ["model", "min_nodes", "sharding", "nodes"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.sampled_from(["", "user", "system", "tool", "text", "image_url", MODEL, "a,b", "\u0000", "\ud7ff\uffff"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "developer", "tool", "x"]) | json_values},
        optional={
            "content": st.text(max_size=50)
            | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]) | json_values}, optional={"text": json_values}), max_size=3)
            | json_values,
            "name": json_values,
        },
    ),
    max_size=4,
)


@st.composite
def mutated_chat(draw: st.DrawFn) -> bytes:
    """A mostly valid chat request with some fields replaced by junk and unknown fields added."""
    body: dict[str, Any] = chat_body(stream=draw(st.booleans()))
    if draw(st.booleans()):
        body["messages"] = draw(messages)
    for field in draw(st.lists(st.sampled_from(CHAT_FIELDS), max_size=4)):
        body[field] = draw(json_values)
    for _ in range(draw(st.integers(0, 2))):
        body[draw(st.text(min_size=1, max_size=12))] = draw(json_values)
    for field in draw(st.lists(st.sampled_from(["model", "messages"]), max_size=1)):
        body.pop(field, None)
    return json.dumps(body).encode()


@st.composite
def mutated_place(draw: st.DrawFn) -> bytes:
    body: dict[str, Any] = {"model": MODEL}
    for field in draw(st.lists(st.sampled_from(PLACE_FIELDS), max_size=3)):
        body[field] = draw(json_values)
    return json.dumps(body).encode()


@st.composite
def huge_or_odd(draw: st.DrawFn) -> bytes:
    """Bodies the parser must refuse cheaply: big (up to 10 MB), deeply nested, invalid UTF-8."""
    kind = draw(st.sampled_from(["big", "nested", "utf8", "bytes", "long_string"]))
    event(f"odd body: {kind}")
    if kind == "big":
        size = draw(st.sampled_from([MAX_BODY - 100, MAX_BODY + 1, 10_000_000]))
        return b'{"model": "' + b"m" * size + b'", "messages": []}'
    if kind == "nested":
        depth = draw(st.sampled_from([100, 5_000, 200_000]))
        return b'{"model": "m", "messages": ' + b"[" * depth + b"]" * depth + b"}"
    if kind == "utf8":
        bad = draw(st.sampled_from([b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xc0\xaf"]))
        junk = draw(st.binary(max_size=4)) + bad + draw(st.binary(max_size=4))
        assert not _is_utf8(junk)
        return b'{"model": "' + junk + b'", "messages": [{"role": "user", "content": "' + junk + b'"}]}'
    if kind == "long_string":
        return json.dumps(chat_body(messages=[{"role": "user", "content": "x" * 2_000_000}], max_tokens=1)).encode()
    return draw(st.binary(max_size=200))


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def bodies_for(method: str, path: str) -> st.SearchStrategy[bytes]:
    junk = st.one_of(json_values.map(lambda v: json.dumps(v).encode()), huge_or_odd())
    if path == "/v1/chat/completions":
        return st.one_of(mutated_chat(), junk)
    if path == "/instances" and method == "POST":
        return st.one_of(mutated_place(), junk)
    return junk


@st.composite
def hostile_request(draw: st.DrawFn) -> tuple[str, str, dict[str, str], bytes]:
    method, path = draw(st.sampled_from(WEIGHTED_ENDPOINTS))
    if draw(st.integers(0, 9)) == 0:  # an arbitrary path, percent-encoded bytes included
        path = "/" + draw(st.text(alphabet="abcdefgxyz/-_.~%0123456789ABCDEF", max_size=30))
    params = {}
    if path == "/instances/previews":
        params = draw(st.dictionaries(st.sampled_from(["model", "nodes", "other"]), st.text(max_size=20), max_size=3))
    body = draw(bodies_for(method, path)) if method in ("POST", "PUT", "PATCH", "DELETE") else b""
    return method, path, params, body


async def check_answer(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:500])
    family = family_of(response.request.url.path)
    if response.status_code >= 400 and family == "ollama":
        assert isinstance(response.json()["error"], str)
    elif response.status_code >= 400 and family == "anthropic":
        assert response.json()["type"] == "error" and set(response.json()["error"]) == {"type", "message"}
    elif response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
    elif response.headers.get("content-type", "").startswith("text/event-stream"):
        assert response.text.endswith("data: [DONE]\n\n")
    elif response.request.url.path == "/":
        # the Ollama banner (the dashboard page only when the client accepts text/html)
        assert response.text == "Ollama is running" or response.request.method == "HEAD"
    elif response.request.url.path.startswith("/dashboard/"):
        # the dashboard's assets (exo_p2p.dashboard)
        assert response.headers["content-type"].startswith(("text/", "application/javascript"))
    elif response.headers.get("content-type", "").startswith("application/x-ndjson"):
        assert all(json.loads(line) for line in response.text.splitlines())
    else:
        json.loads(response.content)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(requests=st.lists(hostile_request(), min_size=1, max_size=8))
def test_hostile_requests_never_5xx_and_api_keeps_serving(requests: list[tuple[str, str, dict[str, str], bytes]]) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            backend = FakeMaster(nursery)
            app = create_app(backend, queue_limit=1)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                with trio.fail_after(30):
                    for method, path, params, body in requests:
                        r = await client.request(method, path, params=params, content=body, headers=JSON)
                        event(f"{method} {path if (method, path) in ENDPOINTS else '<other>'} -> {r.status_code}")
                        await check_answer(r)
                    good = await client.post("/v1/chat/completions", json=chat_body())
                    assert good.status_code == 200, good.text
                    assert not backend.channels  # every chunk channel was closed
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_every_endpoint_survives_10_mb_and_deep_nesting() -> None:
    """The largest hostile bodies, deterministically, once per body-taking endpoint."""
    bodies = [b"[" * 300_000, b'{"x": "' + b"y" * 10_000_000 + b'"}', b"\xff" * 1000]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            app = create_app(FakeMaster(nursery))
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
                with trio.fail_after(30):
                    for method, path in [("POST", "/v1/chat/completions"), ("POST", "/instances"), ("DELETE", "/instances/x")]:
                        for body in bodies:
                            r = await client.request(method, path, content=body, headers=JSON)
                            await check_answer(r)
                            if len(body) > MAX_BODY and method == "POST":
                                assert r.status_code == 413
                    assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 200
            nursery.cancel_scope.cancel()

    trio.run(main)
