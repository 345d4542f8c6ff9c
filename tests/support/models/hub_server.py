"""A local stand-in for a Hugging Face model hub, for tests and ``scripts/bench_hub.py``.

It answers what ``huggingface_hub`` asks a hub (no test ever reaches a real one):

- ``GET /api/models/ORG/NAME[/revision/REV]``: the model info (``sha`` = the commit,
  ``siblings`` with ``size`` and, for LFS files, ``lfs.sha256``);
- ``GET /api/models/ORG/NAME/tree/REV``: the file list (``snapshot_download`` reads it);
- ``HEAD|GET /ORG/NAME/resolve/REV/PATH``: a small file at once (``ETag`` = its git blob id),
  an LFS file (``*.safetensors``) by a 302 redirect to ``/cdn/SHA256`` on a second port with
  ``X-Linked-Size`` and ``X-Linked-Etag``; every answer carries ``X-Repo-Commit``;
  ``Range: bytes=A-B`` answers 206. ``REV`` is ``main`` or the commit, else 404
  ``X-Error-Code: RevisionNotFound``; an unknown repo is 401 ``RepoNotFound`` (as the hub).

Faults for tests (``HubServer.faults``, each a count of answers it spoils, then off):
``drop`` (a body cut after ``drop_after`` bytes and the connection closed), ``unavailable``
(503), ``corrupt`` (the byte at 64 KiB, or the first past it, flipped in one weight
answer: never the header), ``delay`` (seconds before each 64 KiB of a weight answer: a
slow hub, not a count), and ``token`` (every request without
``Authorization: Bearer TOKEN`` gets 401 ``GatedRepo``; the CDN port wants none, as the
hub's CDN takes signed URLs).

``bytes_by_client``: body bytes served per client, the client named by the
``exo-p2p-node/ID`` part of its ``User-Agent`` (``other`` without one).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class Faults:
    """Answers to spoil (module docstring); counts go down as they are used."""

    drop: int = 0
    drop_after: int = 100_000
    unavailable: int = 0
    corrupt: int = 0
    token: str | None = None
    delay: float = 0.0


@dataclass
class Repo:
    """A repo at one commit: its files, and each file's git blob id and SHA-256, computed once
    (a hub does not hash a file per request; doing so cost ~0.3 s per answer of a 100 MB file)."""

    commit: str
    files: dict[str, bytes] = field(default_factory=dict)
    blob_ids: dict[str, str] = field(default_factory=dict)
    sha256s: dict[str, str] = field(default_factory=dict)


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _is_lfs(path: str) -> bool:
    return path.endswith(".safetensors")


class HubServer:
    """The stand-in (module docstring), on 127.0.0.1 in a thread: ``with HubServer() as hub:``
    then ``hub.add_dir("org/name", path)``; ``hub.endpoint`` is the ``HF_ENDPOINT``."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.blobs: dict[str, bytes] = {}
        self.faults = Faults()
        self.bytes_by_client: dict[str, int] = {}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.RLock()
        # the hub and its "CDN" on two ports: huggingface_hub follows a redirect to its own
        # origin itself, and takes an LFS file's metadata from a redirect to another one
        self._servers = [ThreadingHTTPServer(("127.0.0.1", 0), _handler(self)) for _ in range(2)]
        self._threads = []
        for server in self._servers:
            server.daemon_threads = True
            self._threads.append(threading.Thread(target=server.serve_forever, daemon=True))

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._servers[0].server_address[1]}"

    @property
    def cdn(self) -> str:
        return f"http://127.0.0.1:{self._servers[1].server_address[1]}"

    def add_dir(self, repo_id: str, model_dir: Path) -> Repo:
        """Serve every file of ``model_dir`` (recursively) as ``repo_id`` at a commit derived
        from the files."""
        files = {p.relative_to(model_dir).as_posix(): p.read_bytes()
                 for p in sorted(model_dir.rglob("*")) if p.is_file() and not p.name.startswith(".")}
        h = hashlib.sha1()
        sha256s = {path: hashlib.sha256(data).hexdigest() for path, data in files.items()}
        for path in files:
            h.update(path.encode() + b"\0" + bytes.fromhex(sha256s[path]))
        repo = Repo(h.hexdigest(), files, {path: _git_blob_id(data) for path, data in files.items()}, sha256s)
        with self.lock:
            self.repos[repo_id] = repo
            for path, data in files.items():
                if _is_lfs(path):
                    self.blobs[sha256s[path]] = data
        return repo

    def hub_bytes(self, client: str) -> int:
        with self.lock:
            return self.bytes_by_client.get(client, 0)

    def __enter__(self) -> HubServer:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for server, thread in zip(self._servers, self._threads):
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)


def _info(repo_id: str, repo: Repo) -> dict:
    siblings = []
    for path, data in repo.files.items():
        entry = {"rfilename": path, "size": len(data), "blobId": repo.blob_ids[path]}
        if _is_lfs(path):
            entry["lfs"] = {"sha256": repo.sha256s[path], "size": len(data), "pointerSize": 134}
        siblings.append(entry)
    return {"id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False, "gated": False,
            "siblings": siblings, "tags": [], "downloads": 0, "likes": 0}


class Handler(BaseHTTPRequestHandler):
    """The stand-in's answers (module docstring); ``hub`` is set by ``_handler``."""

    hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _client(self) -> str:
        m = re.search(r"exo-p2p-node/([^;\s]+)", self.headers.get("User-Agent", ""))
        return m.group(1) if m else "other"

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        # headers and body in one write, as a real hub's servers send a small answer: written
        # apart, the body waited (Nagle's algorithm) for the ACK of the headers, which the
        # client delays up to 40 ms, on every small file and header a client read
        small = self.command != "HEAD" and 0 < len(body) <= 1 << 20
        self._headers_buffer.append(b"\r\n")
        if small:
            self._headers_buffer.append(body)
        self.flush_headers()
        if self.command != "HEAD" and body and not small:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str) -> None:
        self._send(status, json.dumps({"error": message}).encode(),
                   {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"})

    def _gate(self) -> bool:
        """Apply the request-wide faults; True when the request was answered."""
        with self.hub.lock:
            self.hub.requests.append((self.command, self.path))
            f = self.hub.faults
            signed = self.path.startswith("/cdn/")  # the hub's CDN takes signed URLs, no token
            if f.token is not None and not signed and self.headers.get("Authorization") != f"Bearer {f.token}":
                self._error(401, "GatedRepo", "Access to this model is restricted. You must be authenticated.")
                return True
            if f.unavailable > 0 and self.command == "GET" and "/api/" not in self.path:
                f.unavailable -= 1
                self._error(503, "", "Service Unavailable")
                return True
        return False

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802
        if self._gate():
            return
        path = unquote(urlsplit(self.path).path)
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+?)(?:/revision/([^/]+))?", path):
            return self._api(m.group(1), m.group(2))
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)/?", path):
            return self._tree(m.group(1), m.group(2))
        if m := re.fullmatch(r"/cdn/([0-9a-f]{64})", path):
            with self.hub.lock:
                data = self.hub.blobs.get(m.group(1))
            if data is None:
                return self._error(404, "EntryNotFound", "no such object")
            return self._body(data, {"ETag": f'"{m.group(1)}"'}, weights=True)
        if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            return self._resolve(m.group(1), m.group(2), m.group(3))
        self._error(404, "", "not found")

    def _repo(self, repo_id: str, rev: str | None) -> Repo | None:
        with self.hub.lock:
            repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(401, "RepoNotFound", "Repository not found")
            return None
        if rev not in (None, "main", repo.commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return repo

    def _api(self, repo_id: str, rev: str | None) -> None:
        repo = self._repo(repo_id, unquote(rev) if rev else None)
        if repo is not None:
            self._send(200, json.dumps(_info(repo_id, repo)).encode(), {"Content-Type": "application/json"})

    def _tree(self, repo_id: str, rev: str) -> None:
        repo = self._repo(repo_id, unquote(rev))
        if repo is None:
            return
        out = []
        for s in _info(repo_id, repo)["siblings"]:
            entry = {"type": "file", "oid": s["blobId"], "size": s["size"], "path": s["rfilename"]}
            if "lfs" in s:
                entry["lfs"] = {"oid": s["lfs"]["sha256"], "size": s["size"], "pointerSize": 134}
            out.append(entry)
        self._send(200, json.dumps(out).encode(), {"Content-Type": "application/json"})

    def _resolve(self, repo_id: str, rev: str, file: str) -> None:
        repo = self._repo(repo_id, rev)
        if repo is None:
            return
        data = repo.files.get(file)
        if data is None:
            return self._error(404, "EntryNotFound", f"{file} does not exist")
        common = {"X-Repo-Commit": repo.commit}
        if _is_lfs(file):
            sha = repo.sha256s[file]
            return self._send(302, b"", {**common, "Location": f"{self.hub.cdn}/cdn/{sha}", "X-Linked-Size": str(len(data)),
                                         "X-Linked-Etag": f'"{sha}"', "ETag": f'"{repo.blob_ids[file]}"'})
        self._body(data, {**common, "ETag": f'"{repo.blob_ids[file]}"'}, weights=False)

    def _count(self, n: int) -> None:
        with self.hub.lock:
            client = self._client()
            self.hub.bytes_by_client[client] = self.hub.bytes_by_client.get(client, 0) + n

    def _body(self, data: bytes, headers: dict, *, weights: bool) -> None:
        start, end = 0, len(data)
        rng = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        status = 200
        if rng:
            start = int(rng.group(1))
            end = min(len(data), int(rng.group(2)) + 1) if rng.group(2) else len(data)
            if start >= len(data):
                return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{len(data)}"}
        body = data[start:end]
        cut = None
        with self.hub.lock:
            f = self.hub.faults
            if self.command == "GET" and f.drop > 0 and len(body) > f.drop_after:
                f.drop -= 1
                cut = f.drop_after
            elif self.command == "GET" and weights and f.corrupt > 0 and start + len(body) > 65536 + 16:
                f.corrupt -= 1
                at = max(8, 65536 - start)  # a byte past the first 64 KiB of the file
                body = body[:at] + bytes([body[at] ^ 0xFF]) + body[at + 1:]
            slow = weights and f.delay > 0 and self.command == "GET"
            if self.command == "GET" and not slow:
                self._count(cut if cut is not None else len(body))
        if cut is None and weights and self.hub.faults.delay > 0 and self.command == "GET":
            cut = len(body)  # sent slowly below, 64 KiB at a time
        if cut is None:
            return self._send(status, body, {**headers, "Accept-Ranges": "bytes"})
        self.send_response(status)
        for k, v in {**headers, "Accept-Ranges": "bytes", "Content-Length": str(len(body))}.items():
            self.send_header(k, v)
        self.end_headers()
        for at in range(0, cut, 65536):
            if slow:
                time.sleep(self.hub.faults.delay)
            self.wfile.write(body[at:min(cut, at + 65536)])
            if slow:  # counted as sent: a client killed meanwhile did not get the rest
                self._count(min(cut, at + 65536) - at)
        self.wfile.flush()
        if cut < len(body):
            self.close_connection = True
            self.connection.shutdown(2)


def _handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    return type("BoundHandler", (Handler,), {"hub": hub})
