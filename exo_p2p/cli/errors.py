"""The CLI's errors, and the one-line messages of failed API calls.

A command raises ``CliError`` (or a subclass) for every failure it reports; ``common.handled``
prints it as ``error: <message>`` and exits with ``exit_code`` (1 unless said, 2 for bad
arguments), never a traceback. The messages here name what went wrong in the user's terms:
the API's own error text, a port that is not the API, a refused or unresolvable connection.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx

from exo_p2p.config import DEFAULT_API_PORT, DEFAULT_LISTEN_PORT


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


def not_http_message(url: str, e: Exception) -> str:
    """The error for a URL that answers, but not HTTP: most likely a node's libp2p port."""
    parts = urlsplit(url)
    right = f"{parts.scheme}://{parts.hostname}:{DEFAULT_API_PORT}"
    return (f"{url} does not answer HTTP ({transport_reason(e)}): it is probably a node's libp2p port "
            f"(--listen-port, default {DEFAULT_LISTEN_PORT}), not its API (--api-port, default "
            f"{DEFAULT_API_PORT}); try --api {right}")


def transport_reason(e: Exception) -> str:
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
