"""The ``Host`` rule (``exo_p2p.api.hosts``): a request addressed to a name the node was not
told about is refused, with or without ``Origin``, so a DNS-rebinding page reads nothing.

Pure rules and the guard over httpx's ASGI transport (the fake backend of ``tests.test_api``);
the same refusal in a real browser: ``tests/dashboard/test_dashboard_hosts.py``; the flag on a
real node: ``tests/test_api_access.py::test_node_with_key_file_and_open_host_warning``.
"""

from __future__ import annotations

import httpx
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from exo_p2p.api.access import AccessGuard, AccessPolicy, origin_allowed
from exo_p2p.api.hosts import bind_names, host_allowed, host_of, parse_names, refusal_message
from tests.support.fake_master import MODEL, FakeMaster, chat_body, run_api


@pytest.mark.parametrize(
    "host,names,ok",
    [
        ("127.0.0.1:52515", (), True),
        ("127.0.0.1", (), True),
        ("192.168.1.5:52515", (), True),  # a LAN node reached by its IP
        ("10.0.0.7", (), True),
        ("[::1]:52515", (), True),
        ("[::1]", (), True),
        ("[fe80::1%25eth0]:52515", (), True),  # an IPv6 zone as a URL carries it
        ("[2001:db8::5]:52515", (), True),
        ("::1", (), True),  # not valid HTTP, but an address all the same
        ("localhost:52515", (), True),
        ("LOCALHOST:52515", (), True),
        ("localhost.:52515", (), True),
        ("localhost", (), True),
        ("localhost:", (), True),  # an empty port is allowed by RFC 3986
        (None, (), True),  # HTTP/1.0 without Host: not a browser
        ("", (), True),
        ("evil.test:52515", (), False),  # DNS rebinding
        ("evil.test", (), False),
        ("localhost.evil.test:52515", (), False),
        ("127.0.0.1.evil.test:52515", (), False),
        ("x.localhost:52515", (), False),  # only localhost itself
        ("macbook.local:52515", (), False),
        ("macbook.local:52515", ("macbook.local",), True),
        ("MacBook.Local.:52515", ("macbook.local",), True),
        ("x.macbook.local:52515", ("macbook.local",), False),  # exact names only
        ("anything.example:1", ("*",), True),
        ("localhost:abc", (), False),  # malformed
        ("localhost:123456", (), False),
        ("[::1", (), False),
        ("[::1]x", (), False),
        ("[evil.test]:52515", (), False),
        (":52515", (), False),
    ],
)
def test_host_rule(host: str | None, names: tuple, ok: bool) -> None:
    assert host_allowed(host, parse_names(names)) is ok


_LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)
_DOMAIN = st.builds(lambda labels, tld: ".".join([*labels, tld]),
                    st.lists(_LABEL, min_size=1, max_size=3), st.from_regex(r"[a-z]{2,6}", fullmatch=True))
_PORT = st.one_of(st.just(""), st.integers(1, 65535).map(lambda p: f":{p}"))


@given(_DOMAIN, _PORT, st.lists(_DOMAIN, max_size=3), st.booleans())
def test_a_domain_name_host_is_refused_unless_allowed(domain: str, port: str, others: list[str], upper: bool) -> None:
    """Any name but ``localhost``, with any port, in any case, is refused unless it is one
    of the allowed names (then it is allowed, with or without a trailing dot)."""
    shown = (domain.upper() if upper else domain) + port
    names = parse_names([n for n in others if n != domain])
    assert not host_allowed(shown, names)
    assert host_allowed(shown, parse_names([*others, domain]))
    assert host_allowed(domain + "." + port, parse_names([domain]))


@given(st.ip_addresses(), _PORT)
def test_an_ip_literal_host_is_always_allowed(address, port: str) -> None:
    host = f"[{address}]" if address.version == 6 else str(address)
    assert host_allowed(host + port, ())
    assert host_of(host + port) == str(address)


def test_allowed_host_names_are_parsed_and_checked() -> None:
    assert parse_names(["MacBook.local., nas", "nas", " ", "*"]) == ("macbook.local", "nas", "*")
    assert parse_names(["192.168.1.5"]) == ("192.168.1.5",)
    for bad in ("http://macbook.local", "macbook.local:52515", "*.local", ".local", "a b", "x/y", "-x", "a" * 254):
        with pytest.raises(ValueError, match="not a host name"):
            parse_names([bad])
    with pytest.raises(ValueError, match="allowed host"):
        AccessPolicy.of([], [], ["http://x"])
    policy = AccessPolicy.of([], ["http://app.example:3000", "*"], ["Box.Local"])
    assert policy.host_names == frozenset({"app.example", "box.local"})  # a '*' origin allows no name
    assert "--allowed-hosts evil.test" in refusal_message("evil.test:52515")
    assert bind_names("Box.LAN") == ("box.lan",)  # a node listening on a name answers to it
    assert bind_names("0.0.0.0") == bind_names("::") == bind_names("localhost") == bind_names("192.168.1.5") == ()
    assert "--allowed-hosts" not in refusal_message("a b:1") and "malformed" in refusal_message("[::1")


def test_the_own_origin_of_an_allowed_name_may_call() -> None:
    """The dashboard reached as ``http://box.local:52515`` may post: its origin is the API's
    own once ``box.local`` is an allowed name; a rebinding page's is not."""
    assert origin_allowed("http://box.local:52515", "box.local:52515", (), ("box.local",))
    assert origin_allowed("http://box.local:52515", "BOX.local:52515", (), ("box.local",))
    assert not origin_allowed("http://box.local:52515", "box.local:52515", (), ())
    assert not origin_allowed("http://evil.test:52515", "box.local:52515", (), ("box.local",))
    assert origin_allowed("http://any.test:52515", "any.test:52515", (), ("*",))


REBOUND = {"host": "evil.test:52515"}


def test_reads_from_a_rebound_name_are_refused_in_every_family_shape() -> None:
    """No ``Origin`` (a browser's same-origin GET): the ``Host`` alone refuses it."""

    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        for path in ("/state", "/instances", "/nodes", "/v1/models", "/health", "/", "/dashboard/app.js"):
            r = await client.get(path, headers=REBOUND)
            assert r.status_code == 403, (path, r.text)
            assert backend.node_id not in r.text
        r = await client.get("/state", headers=REBOUND)
        error = r.json()["error"]
        assert error["code"] == "host_not_allowed" and "--allowed-hosts evil.test" in error["message"]
        assert r.headers["x-should-retry"] == "false"
        r = await client.post("/v1/messages", json={}, headers=REBOUND)
        assert r.status_code == 403 and r.json()["type"] == "error" and "--allowed-hosts" in r.json()["error"]["message"]
        r = await client.get("/api/tags", headers=REBOUND)
        assert r.status_code == 403 and set(r.json()) == {"error"} and "--allowed-hosts" in r.json()["error"]
        r = await client.post("/instances", json={"model": MODEL}, headers=REBOUND)
        assert r.status_code == 403 and not backend.commands
        r = await client.post("/v1/chat/completions", json=chat_body(), headers={**REBOUND, "origin": "http://evil.test:52515"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
        for host in ("127.0.0.1:52515", "localhost:52515", "localhost.:52515", "[::1]:52515", "192.168.1.5:52515"):
            r = await client.get("/state", headers={"host": host})
            assert r.status_code == 200, (host, r.text)

    run_api(body)


def test_allowed_names_and_cors_origin_hosts_are_answered() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        assert (await client.get("/state", headers={"host": "box.local:52515"})).status_code == 200
        assert (await client.get("/state", headers={"host": "app.example"})).status_code == 200
        assert (await client.get("/state", headers=REBOUND)).status_code == 403
        own = {"host": "box.local:52515", "origin": "http://box.local:52515"}
        assert (await client.post("/instances", json={"model": MODEL}, headers=own)).status_code == 201

    run_api(body, access=AccessPolicy.of([], ["http://app.example"], ["box.local"]))


def test_cors_star_does_not_allow_any_host_but_allowed_hosts_star_does() -> None:
    async def refused(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        assert (await client.get("/state", headers=REBOUND)).status_code == 403

    async def answered(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        assert (await client.get("/state", headers=REBOUND)).status_code == 200

    run_api(refused, access=AccessPolicy.of([], ["*"]))
    run_api(answered, access=AccessPolicy.of([], [], ["*"]))


def test_a_request_without_host_is_answered() -> None:
    """HTTP/1.0 carries no ``Host`` (httpx always sends one, so the scope is built here)."""
    seen: list[dict] = []

    async def inner(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def send(message: dict) -> None:
        seen.append(message)

    async def receive() -> dict:
        return {"type": "http.request", "body": b""}

    guard = AccessGuard(inner, AccessPolicy())
    for headers in ([], [(b"host", b"")], [(b"host", b"evil.test")]):
        scope = {"type": "http", "method": "GET", "path": "/state", "http_version": "1.0", "headers": headers}
        trio.run(guard, scope, receive, send)
    assert [m["status"] for m in seen if m["type"] == "http.response.start"] == [204, 204, 403]
