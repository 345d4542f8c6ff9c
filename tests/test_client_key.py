"""Who a request comes from (``exo_p2p.api.generation.client_key``), as the runners' fair share of
prefill counts clients: the API key's id when keys are on, else the caller's address and
user agent; bounded in length whatever the headers carry."""

from __future__ import annotations

from exo_p2p.api.generation.client_key import CLIENT_KEY_MAX, client_key


def scope(host: str = "127.0.0.1", agent: bytes | None = b"aider/0.80", key_id: str | None = None) -> dict:
    headers = [(b"host", b"localhost")] + ([(b"user-agent", agent)] if agent is not None else [])
    return {"type": "http", "client": (host, 5555), "headers": headers,
            **({"state": {"api_key_id": key_id}} if key_id else {})}


def test_the_api_key_names_the_client_whatever_the_caller() -> None:
    assert client_key(scope(key_id="0123456789ab")) == "key:0123456789ab"
    assert client_key(scope(host="10.0.0.9", agent=b"other", key_id="0123456789ab")) == "key:0123456789ab"


def test_without_keys_address_and_user_agent_name_the_client() -> None:
    aider, opencode = client_key(scope(agent=b"aider/0.80")), client_key(scope(agent=b"opencode/1.2"))
    assert aider.startswith("peer:") and aider != opencode
    assert client_key(scope(agent=b"aider/0.80")) == aider  # stable: one tool's requests are one client
    assert client_key(scope(host="127.0.0.2")) != aider
    assert client_key(scope(agent=None)).startswith("peer:")
    assert client_key({"type": "http", "headers": []}).startswith("peer:")  # no client address (a test transport)


def test_the_key_is_bounded_whatever_the_headers_carry() -> None:
    long = client_key(scope(agent=b"x" * 100_000))
    assert len(long) <= CLIENT_KEY_MAX and len(client_key(scope(key_id="f" * 500))) <= CLIENT_KEY_MAX
