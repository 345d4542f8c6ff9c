"""A small synchronous client of a node's HTTP API: ``NodeClient``, one method per endpoint.

Every failure of a call becomes a ``CliError`` (``exo_p2p.cli.errors``) with a one-line
message; the CLI prints ``error: <message>`` and exits with ``exit_code`` (1), never a
traceback. Which URL and key a command uses: ``exo_p2p.cli.node_api.endpoint``; how a streamed chat
answer is decoded: ``exo_p2p.cli.node_api.sse``.

Tests inject an ``httpx`` transport with ``set_transport`` (or serve a fake API on
127.0.0.1); production code never sets one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from exo_p2p.cli.node_api.sse import chat_deltas, iter_sse_data
from exo_p2p.cli.node_api.endpoint import local_node_starting, normalize_api_url, resolve_api_key
from exo_p2p.cli.errors import ApiError, CliError, NodeUnreachable, error_message, not_http_message, transport_reason
from exo_p2p.cli.node_api.http_transport import StdlibTransport
from exo_p2p.cli.messages import api_key_message, has_node_ids, name_node_ids

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
            transport=_transport or StdlibTransport(),
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
            f"cannot reach the exo-p2p node at {self.base_url}: {transport_reason(e)} "
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
                raise CliError(f"{method} {path} at {self.base_url} failed: {transport_reason(e)}") from e
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
            raise CliError(f"GET {path} at {self.base_url} failed: {transport_reason(e)}") from e
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
        keep_alive: str | None = None,
        pin: bool = False,
    ) -> dict:
        """``POST /instances``; only the given fields are sent (``keep_alive``: a duration or
        seconds, docs/models.md). The new instance."""
        body: dict[str, Any] = {"model": model}
        if keep_alive is not None:
            body["keep_alive"] = keep_alive
        if pin:
            body["pin"] = True
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
        yield from chat_deltas(self.sse_data("/v1/chat/completions", json={**body, "stream": True}),
                               on_finish, on_usage)

    def sse_data(self, path: str, read_timeout: float = STREAM_READ_TIMEOUT, **kwargs: Any) -> Iterator[str]:
        """``POST path`` (``kwargs``: httpx's ``json``, ``data``, ``files``) answered by a
        server-sent event stream; yields each event's data as it arrives. Raises ``CliError``
        (the API's error, an unreachable node, ``read_timeout`` s of silence, a broken
        stream). Closing the generator closes the connection (the node cancels the work)."""
        timeout = httpx.Timeout(read_timeout, connect=CONNECT_TIMEOUT)
        self.request("GET", "/state")  # waits for a starting node; names a wrong URL
        try:
            with self._http.stream("POST", path, timeout=timeout, **kwargs) as response:
                if response.status_code >= 400:
                    response.read()
                    raise self._api_error(response)
                yield from iter_sse_data(response.iter_lines())
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            raise self._unreachable(e) from e
        except httpx.TimeoutException as e:
            raise CliError(
                f"the node at {self.base_url} sent nothing for {read_timeout:.0f} s"
            ) from e
        except httpx.HTTPError as e:
            raise CliError(f"the answer from {self.base_url} broke off: {transport_reason(e)}") from e


def name_nodes_in(text: str) -> str:
    """``text`` with the whole node ids in it replaced by the nodes' names, asked from the
    node that answered last (``GET /nodes``, ``NAMES_TIMEOUT``); ``text`` unchanged when it
    holds no id, no node answered yet, or the names cannot be had."""
    if last_node is None or not has_node_ids(text):
        return text
    url, key = last_node
    try:
        with httpx.Client(base_url=url, timeout=NAMES_TIMEOUT, transport=_transport or StdlibTransport(), trust_env=False,
                          headers={"authorization": f"Bearer {key}"} if key else None) as http:
            listed = http.get("/nodes").json()
        names = {str(n["node_id"]): str(n["friendly_name"]) for n in listed if n.get("friendly_name")}
    except (httpx.HTTPError, ValueError, TypeError, KeyError, AttributeError):
        return text
    return name_node_ids(text, names)


