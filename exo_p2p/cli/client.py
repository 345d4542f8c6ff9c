"""A small synchronous client of a node's HTTP API, and the errors the CLI shows for it.

Every failure of a call becomes a ``CliError`` with a one-line message; the CLI prints
``error: <message>`` and exits with ``exit_code`` (1), never a traceback.

Tests inject an ``httpx`` transport with ``set_transport`` (or serve a fake API on
127.0.0.1); production code never sets one.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx

from exo_p2p.cli.messages import API_KEY_ENV, api_key_message, check_api_key, has_node_ids, name_node_ids
from exo_p2p.config import DEFAULT_API_HOST, DEFAULT_API_PORT, DEFAULT_LISTEN_PORT

DEFAULT_API = f"http://{DEFAULT_API_HOST}:{DEFAULT_API_PORT}"
API_ENV = "EXO_P2P_API"
REQUEST_TIMEOUT = 30.0
"""Seconds to wait for a plain (non-streaming) API answer."""
STREAM_READ_TIMEOUT = 600.0
"""Seconds without a byte on a streamed chat answer before giving up (a long prompt on a
slow CPU prefills for minutes; the node itself errors a dead request within 10 s)."""
CONNECT_TIMEOUT = 5.0
PING_TIMEOUT = 5.0
"""Seconds ``ping`` waits for ``GET /state`` (a refused connection returns at once)."""

STARTUP_WAIT = 20.0
"""Seconds a client command waits for a node on this machine that is still starting (its
process runs, its API does not answer yet), e.g. right after `exo-p2p node &`."""

_transport: httpx.BaseTransport | None = None
answered_by: str | None = None
"""The API URL whose JSON answer this process decoded last (None: none yet): a command that
then trips over the answer's shape blames that answer (``exo_p2p.cli.common.handled``)."""
last_node: tuple[str, str | None] | None = None
"""The API URL and key of the node that answered last: ``name_nodes_in`` asks it for names."""
NAMES_TIMEOUT = 3.0
"""Seconds ``name_nodes_in`` waits for ``GET /nodes``."""


def set_transport(transport: httpx.BaseTransport | None) -> None:
    """Route every ``NodeClient`` through ``transport`` (tests only; None restores sockets)."""
    global _transport
    _transport = transport


class CliError(Exception):
    """A failure the CLI reports as one line ``error: <message>`` and exit ``exit_code``."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class NodeUnreachable(CliError):
    """No node answers at the API URL (refused, unresolvable, timed out)."""


class ApiError(CliError):
    """The node answered with an error status; ``message`` is the API's error message."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def normalize_api_url(url: str) -> str:
    """``"host:port"`` → ``"http://host:port"``; trailing slashes removed. Raises
    ``CliError`` (exit 2) for a URL with a path, or one that is no URL (an unclosed IPv6
    bracket, a port out of range, an IPv4 address with a part above 255, no host)."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    url = url.rstrip("/")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing it raises for a bad port
        httpx.URL(url)
    except (ValueError, httpx.InvalidURL) as exc:
        raise CliError(f"--api {url}: not a valid URL ({exc})", 2) from None
    if not parts.hostname:
        raise CliError(f"--api {url}: no host in the URL (e.g. --api http://127.0.0.1:52515)", 2)
    if parts.path or parts.query:
        base = f"{parts.scheme}://{parts.netloc}"
        hint = " (OpenAI clients take …/v1; exo-p2p commands take the node's address)" if parts.path.rstrip("/").endswith("/v1") else ""
        raise CliError(f"--api {url}: give the node's address without a path: --api {base}{hint}", 2)
    return url


def resolve_api_url(*candidates: str | None) -> str:
    """The first given URL among ``candidates`` (e.g. subcommand ``--api``, then the global
    one), else ``$EXO_P2P_API``, else ``DEFAULT_API``; normalized."""
    for candidate in candidates:
        if candidate:
            return normalize_api_url(candidate)
    return normalize_api_url(os.environ.get(API_ENV) or DEFAULT_API)


def is_local_url(url: str) -> bool:
    """True when the API URL points at this machine (loopback or ``localhost``)."""
    host = urlsplit(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def _api_port(url: str) -> int:
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def local_node_starting(url: str) -> bool:
    """True when ``url`` is on this machine and a process here is an ``exo-p2p node`` whose
    API port is the URL's (``--api-port``, ``EXO_P2P_API_PORT`` or the default): a node that
    is starting and will answer soon."""
    if not is_local_url(url):
        return False
    import psutil

    port = _api_port(url)
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            argv = proc.info["cmdline"] or []
            if "node" not in argv or not any("exo_p2p" in a or "exo-p2p" in a for a in argv[: argv.index("node")]):
                continue
            given = None
            for i, arg in enumerate(argv):
                if arg == "--api-port" and i + 1 < len(argv):
                    given = argv[i + 1]
                elif arg.startswith("--api-port="):
                    given = arg.split("=", 1)[1]
            if given is None:
                given = (proc.info.get("environ") or {}).get("EXO_P2P_API_PORT") or str(DEFAULT_API_PORT)
            if given == str(port):
                return True
        except (psutil.Error, ValueError):
            continue
    return False


def error_message(response: httpx.Response) -> str:
    """The human message of an API error response: ``error.message`` of the OpenAI-shaped
    body when present, else the body text, else the status line."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str) and err:
            return err
        if body.get("detail"):
            return str(body["detail"])
    text = response.text.strip()
    if body is None and (text.lower().startswith(("<!doctype", "<html")) or "html" in response.headers.get("content-type", "")):
        # not our API: every exo-p2p error is JSON
        return (f"{response.request.url.scheme}://{response.request.url.netloc.decode()} answered HTTP "
                f"{response.status_code} with an HTML page: it is not an exo-p2p node API (wrong --api URL or port?)")
    if text and len(text) < 500 and "\n" not in text:
        return f"HTTP {response.status_code}: {text}"
    return f"HTTP {response.status_code} {response.reason_phrase}"


def iter_sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The ``data`` payload of each server-sent event in ``lines`` (decoded lines without
    their newline). Multi-line data is joined with ``\\n``; comments and other fields are
    ignored; a trailing event without its blank line is still yielded."""
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def chat_deltas(
    payloads: Iterable[str],
    on_finish: Callable[[str], None] | None = None,
    on_usage: Callable[[dict], None] | None = None,
) -> Iterator[str]:
    """Text deltas of an OpenAI chat-completion stream, given its SSE ``data`` payloads.

    Stops at ``[DONE]``. ``on_finish(reason)`` is called with each choice's
    ``finish_reason`` ("stop", "length", …) when a chunk carries one, ``on_usage(usage)``
    with a chunk's ``usage`` object (token counts). Raises ``ApiError`` (status 500) for a chunk carrying an
    ``error`` object (the node reports failures mid-stream that way) or for a payload that
    is not JSON.
    """
    for payload in payloads:
        if payload.strip() == "[DONE]":
            return
        try:
            chunk = json.loads(payload)
        except ValueError as e:
            raise ApiError(f"malformed stream chunk from the node: {payload[:80]!r}", 500) from e
        if not isinstance(chunk, dict):
            continue
        if isinstance(chunk.get("usage"), dict) and on_usage is not None:
            on_usage(chunk["usage"])
        err = chunk.get("error")
        if err:
            message = err.get("message") if isinstance(err, dict) else str(err)
            raise ApiError(str(message or "generation failed"), 500)
        for choice in chunk.get("choices") or ():
            content = (choice.get("delta") or {}).get("content")
            if content:
                yield content
            if choice.get("finish_reason") and on_finish is not None:
                on_finish(str(choice["finish_reason"]))


class NodeClient:
    """Calls to one node's API at ``base_url``; every method returns decoded JSON.

    Raises ``NodeUnreachable`` when no node answers, ``ApiError`` for an error status,
    ``CliError`` for a timeout or a broken answer. ``api_key`` (else ``$EXO_P2P_API_KEY``)
    is sent as ``Authorization: Bearer``; a bad one raises ``CliError`` (exit 2).
    """

    def __init__(self, base_url: str, *, timeout: float = REQUEST_TIMEOUT, api_key: str | None = None) -> None:
        self.base_url = normalize_api_url(base_url)
        key, self.key_source = resolve_api_key(api_key)
        self.api_key = key
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={"authorization": f"Bearer {key}"} if key else None,
            timeout=httpx.Timeout(timeout, connect=CONNECT_TIMEOUT),
            transport=_transport,
            trust_env=False,
        )
        self._start_deadline: float | None = None
        self.on_wait: Callable[[str], None] | None = None
        """Called with a one-line note when the client starts waiting for a starting node."""

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------------

    def _unreachable(self, e: Exception) -> NodeUnreachable:
        return NodeUnreachable(
            f"cannot reach the exo-p2p node at {self.base_url}: {_reason(e)} "
            "(start one with `exo-p2p node`)"
        )

    def _may_wait_for_start(self) -> bool:
        """After a refused connection: True (having slept a moment) while a node on this
        machine is starting and ``STARTUP_WAIT`` seconds have not passed since the first
        refusal; then the caller retries."""
        now = time.monotonic()
        if self._start_deadline is None:
            if not local_node_starting(self.base_url):
                return False
            self._start_deadline = now + STARTUP_WAIT
            if self.on_wait is not None:
                self.on_wait(f"waiting up to {STARTUP_WAIT:.0f} s for the node at {self.base_url} to start…")
        if now >= self._start_deadline:
            return False
        time.sleep(0.25)
        return True

    def _api_error(self, response: httpx.Response) -> ApiError:
        """The ``ApiError`` of an error answer; a 401 says how to give the API key."""
        global last_node
        last_node = (self.base_url, self.api_key)
        if response.status_code == 401:
            return ApiError(api_key_message(self.base_url, self.key_source), 401)
        return ApiError(error_message(response), response.status_code)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One call; the decoded JSON body (None when empty). A node on this machine that
        is still starting is waited for (``STARTUP_WAIT``)."""
        while True:
            try:
                response = self._http.request(method, path, **kwargs)
                break
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                if self._may_wait_for_start():
                    continue
                raise self._unreachable(e) from e
            except httpx.RemoteProtocolError as e:
                raise CliError(not_http_message(self.base_url, e)) from e
            except httpx.TimeoutException as e:
                raise CliError(
                    f"the node at {self.base_url} did not answer {method} {path} in time"
                ) from e
            except httpx.HTTPError as e:
                raise CliError(f"{method} {path} at {self.base_url} failed: {_reason(e)}") from e
        if response.status_code >= 400:
            raise self._api_error(response)
        global answered_by, last_node
        answered_by = self.base_url
        last_node = (self.base_url, self.api_key)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError as e:
            raise CliError(f"the node at {self.base_url} sent a non-JSON answer to {path}") from e

    def text(self, path: str) -> str | None:
        """The text body of ``GET path`` (``/metrics``), or None when the node refuses it
        (4xx or 5xx). Raises ``CliError`` when the node cannot be reached."""
        try:
            response = self._http.get(path)
        except httpx.ConnectError as e:
            raise self._unreachable(e) from e
        except httpx.HTTPError as e:
            raise CliError(f"GET {path} at {self.base_url} failed: {_reason(e)}") from e
        return response.text if response.status_code < 400 else None

    def ping(self, timeout: float = PING_TIMEOUT) -> bool:
        """True when something answers HTTP at ``GET /state`` within ``timeout`` seconds,
        whatever the status (a troubled node is still a node: ``run`` must not start a
        second one on the same data dir); False on any transport error."""
        try:
            self._http.get("/state", timeout=timeout)
        except httpx.HTTPError:
            return False
        return True

    # -- endpoints ------------------------------------------------------------------------

    def state(self) -> dict:
        return self.request("GET", "/state")

    def nodes(self) -> list[dict]:
        return self.request("GET", "/nodes")

    def models(self) -> list[dict]:
        return self.request("GET", "/models")

    def instances(self) -> list[dict]:
        return self.request("GET", "/instances")

    def instance(self, instance_id: str) -> dict:
        return self.request("GET", f"/instances/{instance_id}")

    def place(
        self,
        model: str,
        *,
        min_nodes: int | None = None,
        sharding: str | None = None,
        nodes: list[str] | None = None,
    ) -> dict:
        """``POST /instances``; only the given fields are sent. The new instance."""
        body: dict[str, Any] = {"model": model}
        if min_nodes is not None:
            body["min_nodes"] = min_nodes
        if sharding is not None:
            body["sharding"] = sharding
        if nodes:
            body["nodes"] = nodes
        return self.request("POST", "/instances", json=body)

    def delete_instance(self, instance_id: str) -> Any:
        return self.request("DELETE", f"/instances/{instance_id}")

    def previews(self, model: str, nodes: list[str] | None = None) -> list[dict]:
        params = {"model": model}
        if nodes:
            params["nodes"] = ",".join(nodes)
        return self.request("GET", "/instances/previews", params=params)

    def chat_stream(
        self,
        body: dict,
        on_finish: Callable[[str], None] | None = None,
        on_usage: Callable[[dict], None] | None = None,
    ) -> Iterator[str]:
        """``POST /v1/chat/completions`` with ``stream: true``; yields text deltas as they
        arrive (``on_finish``/``on_usage`` as ``chat_deltas``). Closing the generator closes the connection (the node cancels the
        generation)."""
        body = {**body, "stream": True}
        timeout = httpx.Timeout(STREAM_READ_TIMEOUT, connect=CONNECT_TIMEOUT)
        self.request("GET", "/state")  # waits for a starting node; names a wrong URL
        try:
            with self._http.stream(
                "POST", "/v1/chat/completions", json=body, timeout=timeout
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise self._api_error(response)
                yield from chat_deltas(iter_sse_data(response.iter_lines()), on_finish, on_usage)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            raise self._unreachable(e) from e
        except httpx.TimeoutException as e:
            raise CliError(
                f"the node at {self.base_url} sent nothing for {STREAM_READ_TIMEOUT:.0f} s"
            ) from e
        except httpx.HTTPError as e:
            raise CliError(f"the answer from {self.base_url} broke off: {_reason(e)}") from e


def resolve_api_key(given: str | None) -> tuple[str | None, str | None]:
    """The API key to send and where it came from: ``given`` (``--api-key``), else
    ``$EXO_P2P_API_KEY`` when set and not blank, else ``(None, None)``. Raises ``CliError``
    (exit 2) for a given key that is blank or no HTTP header can carry (``check_api_key``)."""
    try:
        if given is not None:
            return check_api_key(given, "--api-key"), "--api-key"
        env = os.environ.get(API_KEY_ENV, "")
        if env.strip():
            return check_api_key(env, f"${API_KEY_ENV}"), f"${API_KEY_ENV}"
    except ValueError as e:
        raise CliError(str(e), 2) from None
    return None, None


def name_nodes_in(text: str) -> str:
    """``text`` with the whole node ids in it replaced by the nodes' names, asked from the
    node that answered last (``GET /nodes``, ``NAMES_TIMEOUT``); ``text`` unchanged when it
    holds no id, no node answered yet, or the names cannot be had."""
    if last_node is None or not has_node_ids(text):
        return text
    url, key = last_node
    try:
        with httpx.Client(base_url=url, timeout=NAMES_TIMEOUT, transport=_transport, trust_env=False,
                          headers={"authorization": f"Bearer {key}"} if key else None) as http:
            listed = http.get("/nodes").json()
        names = {str(n["node_id"]): str(n["friendly_name"]) for n in listed if n.get("friendly_name")}
    except (httpx.HTTPError, ValueError, TypeError, KeyError, AttributeError):
        return text
    return name_node_ids(text, names)


def not_http_message(url: str, e: Exception) -> str:
    """The error for a URL that answers, but not HTTP: most likely a node's libp2p port."""
    parts = urlsplit(url)
    right = f"{parts.scheme}://{parts.hostname}:{DEFAULT_API_PORT}"
    return (f"{url} does not answer HTTP ({_reason(e)}): it is probably a node's libp2p port "
            f"(--listen-port, default {DEFAULT_LISTEN_PORT}), not its API (--api-port, default "
            f"{DEFAULT_API_PORT}); try --api {right}")


def _reason(e: Exception) -> str:
    """A short lower-case reason for a transport error ("connection refused", ...)."""
    text = str(e) or type(e).__name__
    lowered = text.lower()
    if "refused" in lowered:
        return "connection refused"
    if isinstance(e, httpx.TimeoutException) or "timed out" in lowered:
        return "timed out"
    if "name or service not known" in lowered or "nodename nor servname" in lowered:
        return "unknown host"
    if "temporary failure in name resolution" in lowered:
        return "unknown host"
    return text.splitlines()[0]
