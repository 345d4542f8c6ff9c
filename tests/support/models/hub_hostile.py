"""Hostile repos on the stand-in hub (``tests/support/models/hub_server.py``): a model repository is untrusted
input, and these are the lies and stalls a publisher, a mirror or a plain-HTTP
``HF_ENDPOINT`` can serve (docs/security.md). ``HostileHub`` is a ``HubServer`` whose
repos may each carry a ``Hostile`` mode:

- ``listed``: path -> the size its listing claims (e.g. ``model.safetensors`` at 2^62
  bytes), whatever the file holds;
- ``siblings``: that many extra junk entries in its listing (a listing of 500,000 files);
- ``ignore_range``: paths answered whole with 200 and ``padding`` bytes appended, whatever
  ``Range`` asked (a server sending more than the listed size);
- ``error_body``: the listing answered 401 ``RepoNotFound`` with that many bytes of body (an
  error answer that never ends, as far as a reader is concerned);
- ``trickle``: seconds between two bytes of every answer about the repo (its listing, its
  files): a hub that never quite stalls. ``trickling`` counts those answers in progress.

Listings are built once per repo (a 500,000-entry listing is ~50 MB of JSON).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from tests.support.models.hub_server import Handler, HubServer, _info


@dataclass
class Hostile:
    """One repo's hostile mode (module docstring)."""

    listed: dict[str, int] = field(default_factory=dict)
    siblings: int = 0
    ignore_range: tuple[str, ...] = ()
    padding: int = 0
    trickle: float = 0.0
    error_body: int = 0
    _listing: bytes | None = None


class HostileHub(HubServer):
    """A ``HubServer`` serving ``hostile[repo_id]`` modes (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.hostile: dict[str, Hostile] = {}
        self.trickling = 0
        bound = type("HostileBound", (HostileHandler,), {"hub": self})
        for server in self._servers:
            server.RequestHandlerClass = bound

    def listing(self, repo_id: str) -> bytes:
        """The repo's listing as its mode lies about it (built once)."""
        mode = self.hostile[repo_id]
        if mode._listing is None:
            info = _info(repo_id, self.repos[repo_id])
            for s in info["siblings"]:
                if s["rfilename"] in mode.listed:
                    s["size"] = mode.listed[s["rfilename"]]
                    if "lfs" in s:
                        s["lfs"]["size"] = s["size"]
            info["siblings"] += [{"rfilename": f"junk/{i:07d}.bin", "size": 1, "blobId": "0" * 40}
                                 for i in range(mode.siblings)]
            mode._listing = json.dumps(info).encode()
        return mode._listing


class HostileHandler(Handler):
    """``Handler`` with the hostile modes of the repo a request is about."""

    hub: HostileHub
    _mode: Hostile | None = None

    def do_GET(self) -> None:  # noqa: N802
        path = unquote(urlsplit(self.path).path)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+?)(?:/revision/[^/]+)?", path) or re.fullmatch(
            r"/([^/]+/[^/]+)/resolve/[^/]+/(.+)", path)
        self._mode = self.hub.hostile.get(m.group(1)) if m else None
        if self._mode is None or m is None:
            return super().do_GET()
        if path.startswith("/api/") and self._mode.error_body:
            return self._endless_error(self._mode.error_body)
        if path.startswith("/api/"):
            with self.hub.lock:
                self.hub.requests.append((self.command, self.path))
            return self._send(200, self.hub.listing(m.group(1)), {"Content-Type": "application/json"})
        file = m.group(2)
        if file in self._mode.ignore_range:
            data = self.hub.repos[m.group(1)].files[file] + b" " * self._mode.padding
            return self._send(200, data, {"X-Repo-Commit": self.hub.repos[m.group(1)].commit})
        return super().do_GET()

    def _endless_error(self, size: int) -> None:
        """401 ``RepoNotFound`` with ``size`` bytes of body, written 1 MiB at a time (no big
        buffer in this process: a test measures the reader's memory here)."""
        self.send_response(401)
        for k, v in {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found",
                     "Content-Length": str(size)}.items():
            self.send_header(k, v)
        self.end_headers()
        block = b" " * (1 << 20)
        try:
            for at in range(0, size, len(block)):
                self.wfile.write(block[:size - at])
        except OSError:  # the reader stopped at its bound
            pass
        self.close_connection = True

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        if self._mode is None or not self._mode.trickle or self.command == "HEAD":
            try:
                return super()._send(status, body, headers)
            except OSError:  # the client stopped reading at its bound: what a refusal looks like
                self.close_connection = True
                return None
        self.send_response(status)
        for k, v in {**(headers or {}), "Content-Length": str(len(body))}.items():
            self.send_header(k, v)
        self.end_headers()
        with self.hub.lock:
            self.hub.trickling += 1
        try:
            for at in range(len(body)):  # one byte per ``trickle`` s, until the client leaves
                self.wfile.write(body[at:at + 1])
                self.wfile.flush()
                time.sleep(self._mode.trickle)
        except OSError:
            self.close_connection = True
        finally:
            with self.hub.lock:
                self.hub.trickling -= 1
