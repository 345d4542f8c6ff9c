"""API keys, CORS and the refusal of cross-site requests (``exo_p2p.api.access``), against the
fake backend of ``tests.test_api``; and the node's flags and start-up warning on a real node.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from exo_p2p.api.access import (
    AccessPolicy,
    is_json_content_type,
    is_loopback_host,
    origin_allowed,
    read_api_key_file,
)
from exo_p2p.cli.errors import CliError
from exo_p2p.cli.cluster.node_config import build_node_config
from exo_p2p.types import DeleteInstance, PlaceInstance
from tests.support.cluster import NodeProcess, wait_until
from tests.support.fake_master import MODEL, UNPLACED, FakeMaster, chat_body, run_api

KEY = "sk-test-0123456789"
KEYED = AccessPolicy.of([KEY, "second-key"])


def _mutations(backend: FakeMaster) -> list:
    return [c for c in backend.commands if isinstance(c, (PlaceInstance, DeleteInstance))]


# ------------------------------------------------------------------------------ pure rules


@pytest.mark.parametrize(
    "origin,host,allowed,ok",
    [
        ("http://127.0.0.1:52515", "127.0.0.1:52515", (), True),  # the node's own page
        ("http://localhost:52515", "localhost:52515", (), True),
        ("http://[::1]:52515", "[::1]:52515", (), True),
        ("http://192.168.1.5:52515", "192.168.1.5:52515", (), True),  # own page over the LAN
        ("http://evil.example", "127.0.0.1:52515", (), False),  # another site
        ("http://evil.example:52515", "evil.example:52515", (), False),  # DNS rebinding
        ("null", "127.0.0.1:52515", (), False),  # sandboxed frame / file://
        ("http://app.example", "127.0.0.1:52515", ("http://app.example",), True),
        ("http://app.example/", "127.0.0.1:52515", ("http://app.example",), True),
        ("http://other.example", "127.0.0.1:52515", ("http://app.example",), False),
        ("http://anything", "127.0.0.1:52515", ("*",), True),
    ],
)
def test_origin_rule(origin: str, host: str, allowed: tuple, ok: bool) -> None:
    assert origin_allowed(origin, host, allowed) is ok


_LABEL = st.from_regex(r"[a-z0-9][a-z0-9-]{0,9}", fullmatch=True)


@given(st.lists(_LABEL, min_size=1, max_size=3), st.from_regex(r"[a-z]{2,6}", fullmatch=True))
def test_a_domain_name_host_is_never_same_origin(labels: list[str], tld: str) -> None:
    """DNS rebinding: a page whose host is a domain name (not an IP, not localhost) is never
    treated as the node's own page, whatever Host header its requests carry."""
    domain = ".".join([*labels, tld])
    assert not origin_allowed(f"http://{domain}:52515", f"{domain}:52515", ())


def test_content_type_loopback_key_file_and_origin_parsing() -> None:
    assert is_json_content_type("application/json")
    assert is_json_content_type("Application/JSON; charset=utf-8")
    assert is_json_content_type("application/merge-patch+json")
    for bad in (None, "", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        assert not is_json_content_type(bad)
    assert all(is_loopback_host(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"))
    assert not any(is_loopback_host(h) for h in ("0.0.0.0", "192.168.1.2", "::", "example.com"))
    assert read_api_key_file("# keys\nk1\n\n  k2  \n") == ["k1", "k2"]
    policy = AccessPolicy.of([" a ", ""], ["http://x.example, https://y.example:8443/", "*"])
    assert policy.api_keys == frozenset({"a"})
    assert policy.cors_origins == ("http://x.example", "https://y.example:8443", "*")
    for bad in ("x.example", "ftp://x.example", "http://x.example/path"):
        with pytest.raises(ValueError, match="CORS origin"):
            AccessPolicy.of([], [bad])


def test_node_flags_build_the_policy(tmp_path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# one a line\nfile-key\n")
    cfg = build_node_config(data_dir=tmp_path, api_keys=["flag-key"], api_key_file=keys, cors_origins=["http://a.example,http://b.example"],
                            allowed_hosts=["MacBook.local.,nas", "nas"])
    assert sorted(cfg.api_keys) == ["file-key", "flag-key"]
    assert cfg.cors_origins == ["http://a.example", "http://b.example"]
    assert cfg.allowed_hosts == ["macbook.local", "nas"]
    assert build_node_config(data_dir=tmp_path).api_keys == []
    assert build_node_config(data_dir=tmp_path).allowed_hosts == []
    (tmp_path / "empty").write_text("\n# nothing\n")
    for kwargs, needle in [
        ({"api_key_file": tmp_path / "empty"}, "holds no key"),
        ({"api_key_file": tmp_path / "missing"}, "--api-key-file"),
        ({"api_keys": ["  "]}, "must not be empty"),
        ({"cors_origins": ["nota-url"]}, "--cors-origins"),
        ({"allowed_hosts": ["http://macbook.local:52515"]}, "--allowed-hosts"),
    ]:
        with pytest.raises(CliError, match=needle) as info:
            build_node_config(data_dir=tmp_path, **kwargs)
        assert info.value.exit_code == 2


# ------------------------------------------------------------------------------- API keys


def test_keys_every_route_but_health_in_the_family_error_shape() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        r = await client.get("/health")
        assert r.status_code == 200 and r.json()["status"] == "ok"
        for path in ("/v1/models", "/state", "/instances", "/nodes"):
            r = await client.get(path)
            assert r.status_code == 401, (path, r.text)
            assert r.json()["error"]["code"] == "invalid_api_key"
            assert "missing API key" in r.json()["error"]["message"]
        r = await client.get("/v1/models", headers={"authorization": "Bearer wrong"})
        assert r.status_code == 401 and "invalid API key" in r.json()["error"]["message"]
        assert r.headers["x-should-retry"] == "false"
        for key in (KEY, "second-key"):
            assert (await client.get("/v1/models", headers={"authorization": f"Bearer {key}"})).status_code == 200
        # x-api-key is the Anthropic family's header, not accepted on OpenAI routes
        assert (await client.get("/v1/models", headers={"x-api-key": KEY})).status_code == 401
        r = await client.post("/v1/chat/completions", json=chat_body())
        assert r.status_code == 401 and not backend.commands
        r = await client.post("/v1/chat/completions", json=chat_body(), headers={"authorization": f"Bearer {KEY}"})
        assert r.status_code == 200
        # Anthropic routes: Anthropic's error shape; x-api-key accepted
        r = await client.post("/v1/messages", json={})
        assert r.status_code == 401
        assert r.json() == {"type": "error", "error": {"type": "authentication_error", "message": r.json()["error"]["message"]}}
        r = await client.post("/v1/messages", json={}, headers={"x-api-key": KEY})
        assert r.status_code != 401
        # Ollama routes: Ollama's error shape
        r = await client.get("/api/tags")
        assert r.status_code == 401 and set(r.json()) == {"error"} and "API key" in r.json()["error"]

    run_api(body, access=KEYED)


@pytest.mark.integration
def test_cli_client_sends_the_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from exo_p2p.cli.node_api.client import NodeClient
    from exo_p2p.cli.errors import ApiError as CliApiError
    from exo_p2p.cli.messages import API_KEY_ENV
    from tests.support.fake_master import run_served

    def use(url: str) -> tuple[Any, Any]:
        monkeypatch.delenv(API_KEY_ENV, raising=False)
        with NodeClient(url) as client:
            try:
                client.state()
            except CliApiError as exc:
                refused = exc
        monkeypatch.setenv(API_KEY_ENV, KEY)
        with NodeClient(url) as client:
            return refused, client.state()

    async def body(url: str, backend: FakeMaster) -> None:
        refused, state = await trio.to_thread.run_sync(lambda: use(url))
        assert "API key" in str(refused)
        assert state["master"] == backend.node_id

    run_served(body, access=KEYED)


def test_should_not_retry_rule() -> None:
    from exo_p2p.api.errors import error_headers, should_not_retry
    from exo_p2p.types import ErrorInfo

    for status in (400, 401, 403, 404, 409, 413, 415):
        assert should_not_retry(ErrorInfo(status, "m", "t"))
    for status, code in ((408, None), (429, "queue_full"), (500, None), (503, "loading"), (503, "instance_failed"), (504, "timeout")):
        assert not should_not_retry(ErrorInfo(status, "m", "t", code=code))
    assert error_headers(ErrorInfo(503, "no memory", "server_error", code="out_of_memory")) == {"x-should-retry": "false"}
    assert error_headers(ErrorInfo(503, "loading", "server_error", code="loading")) == {"retry-after": "5"}


# -------------------------------------------------------------------- cross-site requests


def test_cross_site_form_posts_and_foreign_origins_change_nothing() -> None:
    """A page on another site can neither place nor delete nor chat."""

    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        form = {"model": MODEL}
        # a browser sends Origin on every cross-site POST: from an allowed page (the node's
        # own), a form content type is still refused; a foreign origin is refused before that
        own_page = {"origin": "http://127.0.0.1:52515", "host": "127.0.0.1:52515"}
        for kwargs, typed in (({"data": form}, {}), ({"content": b'{"model": "m"}'}, {"content-type": "text/plain"}),
                              ({"files": {"f": b"x"}}, {}), ({"content": b'{"model": "m"}'}, {})):
            r = await client.post("/instances", **kwargs, headers={**typed, **own_page})  # type: ignore[arg-type]
            assert r.status_code == 415, r.text
            assert r.json()["error"]["code"] == "unsupported_media_type"
            r = await client.post("/instances", **kwargs, headers={**typed, "origin": "http://evil.example"})  # type: ignore[arg-type]
            assert r.status_code == 403, r.text
        r = await client.post("/v1/chat/completions", data={"model": MODEL}, headers=own_page)
        assert r.status_code == 415
        # without Origin (curl -d, SDKs) the content type does not matter: a form body is not
        # JSON (400), JSON sent as a form reaches the route
        r = await client.post("/v1/chat/completions", data={"model": MODEL})
        assert r.status_code == 400 and "JSON" in r.json()["error"]["message"], r.text
        assert not backend.commands
        evil = {"origin": "http://evil.example"}
        r = await client.post("/instances", json={"model": MODEL}, headers=evil)
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
        assert "access-control-allow-origin" not in r.headers
        assert (await client.delete("/instances/x", headers=evil)).status_code == 403
        assert (await client.post("/v1/chat/completions", json=chat_body(), headers=evil)).status_code == 403
        assert (await client.post("/api/chat", json={}, headers=evil)).json().keys() == {"error"}
        assert (await client.get("/state", headers=evil)).status_code == 403
        rebinding = {"origin": "http://evil.example:80", "host": "evil.example:80"}
        assert (await client.post("/instances", json={"model": MODEL}, headers=rebinding)).status_code == 403
        assert not _mutations(backend) and not backend.commands
        # the node's own page (same origin, IP host) and non-browser clients (no Origin) work
        own = {"origin": "http://127.0.0.1:52515", "host": "127.0.0.1:52515"}
        assert (await client.post("/instances", json={"model": MODEL}, headers=own)).status_code == 201
        assert (await client.post("/instances", json={"model": MODEL})).status_code == 201
        form_json = {"content": b'{"model": "%s"}' % MODEL.encode(), "headers": {"content-type": "application/x-www-form-urlencoded"}}
        assert (await client.post("/instances", **form_json)).status_code == 201  # type: ignore[arg-type]
        assert len(_mutations(backend)) == 3

    run_api(body)


def test_a_cross_site_img_get_is_refused_on_a_keyless_node() -> None:
    """``<img src=http://127.0.0.1:52515/instances/previews?model=…>`` on another site's page:
    a GET with no ``Origin`` (rule 1 cannot see it) but ``Sec-Fetch-Site: cross-site`` is
    refused in each family's shape before any route runs; same-origin, direct and public
    requests are served."""

    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        img = {"sec-fetch-site": "cross-site", "sec-fetch-mode": "no-cors", "sec-fetch-dest": "image"}
        for path in ("/instances/previews?model=org/evil", "/state", "/v1/models", "/api/tags"):
            r = await client.get(path, headers=img)
            assert r.status_code == 403, (path, r.text)
            assert "cross-site" in r.text
        r = await client.get("/instances/previews?model=org/evil", headers=img)
        assert r.json()["error"]["code"] == "cross_site_refused"
        link = {"sec-fetch-site": "cross-site", "sec-fetch-mode": "navigate"}
        assert (await client.get("/instances/previews?model=x", headers=link)).status_code == 403
        assert (await client.get("/health", headers=img)).status_code == 200  # public
        for ok in ({"sec-fetch-site": "same-origin"}, {"sec-fetch-site": "none"}, {}):
            assert (await client.get("/state", headers=ok)).status_code == 200, ok
        assert not backend.commands

    run_api(body)


def test_cors_origins_allow_a_listed_origin_and_answer_its_preflight() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        app_origin = {"origin": "http://app.example"}
        preflight = {**app_origin, "access-control-request-method": "POST", "access-control-request-headers": "authorization, content-type"}
        r = await client.options("/v1/chat/completions", headers=preflight)
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "http://app.example"
        assert "authorization" in r.headers["access-control-allow-headers"].lower()
        r = await client.post("/v1/chat/completions", json=chat_body(), headers=app_origin)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://app.example"
        other = {"origin": "http://other.example", "access-control-request-method": "POST"}
        r = await client.options("/v1/chat/completions", headers=other)
        assert "access-control-allow-origin" not in r.headers
        assert (await client.post("/instances", json={"model": MODEL}, headers={"origin": "http://other.example"})).status_code == 403

    run_api(body, access=AccessPolicy.of([], ["http://app.example"]))


def test_cors_star_allows_any_origin() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        r = await client.post("/v1/chat/completions", json=chat_body(), headers={"origin": "http://any.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"

    run_api(body, access=AccessPolicy.of([], ["*"]))


# ---------------------------------------------------------------- retry hints on errors


def test_errors_retrying_cannot_fix_say_so_and_loading_keeps_retry_after() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        for model, status in ((UNPLACED, 409), ("no-such-model", 404)):
            r = await client.post("/v1/chat/completions", json=chat_body(model=model))
            assert r.status_code == status and r.headers["x-should-retry"] == "false"
        r = await client.post("/v1/chat/completions", json=chat_body(messages=[]))
        assert r.status_code == 400 and r.headers["x-should-retry"] == "false"
        r = await client.post("/v1/chat/completions", json=chat_body(model="loading-model"))
        assert r.status_code == 503 and r.headers["retry-after"] == "5" and "x-should-retry" not in r.headers

    run_api(body)


# ------------------------------------------------------------------------- a real node


@pytest.mark.integration
def test_node_with_key_file_and_open_host_warning(tmp_path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(KEY + "\n")
    node = NodeProcess(tmp_path / "keyed", extra_args=["--api-key-file", str(keys), "--api-host", "127.0.0.1",
                                                       "--allowed-hosts", "box.test"])
    open_node = NodeProcess(tmp_path / "open", extra_args=["--api-host", "0.0.0.0"])
    try:
        node.start()
        assert node.get("/state").status_code == 401
        assert node.get("/state", headers={"authorization": f"Bearer {KEY}"}).status_code == 200
        assert node.get("/health").status_code == 200
        # the Host rule (exo_p2p.api.hosts) comes before the key, and the flag widens it
        rebound = node.get("/health", headers={"host": f"evil.test:{node.api_port}"})
        assert rebound.status_code == 403 and "--allowed-hosts evil.test" in rebound.json()["error"]["message"]
        assert node.get("/health", headers={"host": f"box.test:{node.api_port}"}).status_code == 200
        assert "without an API key" not in node.log_path.read_text()
        open_node.start()
        wait_until(lambda: "without an API key" in open_node.log_path.read_text(), timeout=10, what="open-API warning")
    finally:
        node.stop()
        open_node.stop()
