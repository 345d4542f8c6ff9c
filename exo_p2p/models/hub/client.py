"""A Hugging Face model hub as one more source of a model's bytes (docs/models.md#models-from-a-hub).

Everything the hub needs goes through ``huggingface_hub``: the endpoint (``HF_ENDPOINT``),
the token (``HF_TOKEN``, else the stored one), ``HF_HUB_OFFLINE``, the session and its
error types. ``HubClient`` reads one repo at one commit:

- ``info()``: the commit and the files with their sizes and LFS SHA-256
  (``HfApi.model_info(files_metadata=True)``);
- ``get_range(path, start, end)``: bytes ``[start, end)`` of a file with an HTTP ``Range``
  request to its ``/resolve/<commit>/`` URL (redirects followed); ``stream_range`` hands them
  to a sink as they arrive instead (a run of chunks written as each one completes). A
  dropped connection is resumed from the bytes received; a 429/5xx, a timeout or a refused connection is retried
  with doubling pauses (``RETRY_PAUSE`` .. ``RETRY_PAUSE_MAX``), at most ``attempts`` tries
  in all; an answer from another commit (``X-Repo-Commit``), of another LFS object
  (``X-Linked-Etag``) or of another length is refused.

Every failure is a ``HubError`` naming the cause and what to do (set ``HF_TOKEN``, check the
revision, try again later, ``--offline``). Blocking: callers run it in a thread.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.hub.listing import fetch_listing, sibling_fields, status_error
from exo_p2p.models.hub.stop import HubStopped, Stop, read_timeout

log = structlog.get_logger(__name__)

RETRY_PAUSE = 0.5
RETRY_PAUSE_MAX = 8.0
"""Seconds before the first retry of a failed hub request, and the most between two."""
ATTEMPTS = 6
"""Tries of one range request (the first and the retries) before it fails."""
TIMEOUT = 30.0
"""Seconds a hub request may wait for its next bytes."""
_REPO_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_SHA_RE = re.compile(r"[0-9a-f]{40}")
_TRUE = {"1", "true", "yes", "on"}


class HubError(RuntimeError):
    """The hub cannot give what was asked (the message names the cause and what to do)."""


class _SinkFailed(Exception):
    """A ``stream_range`` sink raised (its exception is the cause): not the hub's failure."""


@dataclass(frozen=True)
class HubFile:
    """One file of a repo: ``path`` in it, ``size`` bytes, ``sha256`` of an LFS file ("" else),
    ``blob_id`` its git blob id ("" when the hub gave none)."""

    path: str
    size: int
    sha256: str = ""
    blob_id: str = ""


def parse_repo(name: str) -> tuple[str, str | None]:
    """``ORG/NAME[@REVISION]`` -> ``(repo id, revision or None)``. Raises ``ValueError`` for
    anything else (a model name without an org is never a hub repo here)."""
    repo, _, revision = name.partition("@")
    if not _REPO_RE.fullmatch(repo) or ".." in repo or (revision == "" and "@" in name):
        raise ValueError(f"{name!r} is not a Hugging Face repo id (ORG/NAME, optionally @REVISION)")
    return repo, revision or None


def is_repo_id(name: str) -> bool:
    """Whether ``name`` reads as ``ORG/NAME[@REVISION]`` (``parse_repo`` accepts it)."""
    try:
        parse_repo(name)
    except ValueError:
        return False
    return True


def hub_offline(offline: bool = False) -> bool:
    """True when nothing may come from a hub: the node's ``--offline`` or ``HF_HUB_OFFLINE``
    (read now, not at import)."""
    return offline or os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def endpoint() -> str:
    """The hub's base URL: ``HF_ENDPOINT`` (read now), else ``huggingface_hub``'s default."""
    from huggingface_hub import constants  # lazy: a ~0.2 s import, hub reads only

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def preload() -> None:
    """Import what a hub request uses (``huggingface_hub``'s API, session and URL helpers:
    ~0.1–0.2 s on first use) so that a node's first placement or pull does not wait for it.
    Blocking; run it in a thread. Never asks the hub anything."""
    from huggingface_hub import HfApi, get_session, hf_hub_url  # noqa: F401
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status  # noqa: F401

    get_session()


def _advice(exc: Exception, repo: str, revision: str | None) -> str:
    """A ``huggingface_hub`` error as one line naming the cause and what to do."""
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, RepositoryNotFoundError,
                                        RevisionNotFoundError)  # lazy: a ~0.2 s import, hub reads only

    where = endpoint()
    if isinstance(exc, GatedRepoError):
        return (f"model {repo} on {where} is gated: accept its terms on the hub with your account, "
                f"then set HF_TOKEN (or run `hf auth login`) on every node")
    if isinstance(exc, RepositoryNotFoundError):
        return (f"model {repo} not found on {where}, or it is private: check the name, or set HF_TOKEN "
                f"(or run `hf auth login`) to a token that can read it")
    if isinstance(exc, RevisionNotFoundError):
        return f"revision {revision!r} not found in model {repo} on {where}: check the branch, tag or commit"
    if isinstance(exc, EntryNotFoundError):
        return f"a file of model {repo} is missing on {where} ({exc})"
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status in (401, 403):
        return f"the hub at {where} refused access to model {repo} ({status}): set HF_TOKEN to a token that can read it"
    if status is not None:
        return f"the hub at {where} answered {status} for model {repo}; try again later ({exc})"
    return (f"cannot reach the model hub at {where} ({type(exc).__name__}: {exc}); check the network, "
            f"or place a model some node holds (--offline never asks a hub)")


class HubClient:
    """One repo of the hub (module docstring). ``revision``: a branch, tag or commit (None:
    the default branch); ``info()`` pins it to a commit, used by every later request.
    ``user_agent`` (a dict) is added to the ``User-Agent`` header."""

    def __init__(self, repo_id: str, revision: str | None = None, *, user_agent: dict | None = None,
                 attempts: int = ATTEMPTS, pause: float = RETRY_PAUSE, timeout: float = TIMEOUT) -> None:
        self.repo_id, self.revision = repo_id, revision
        self.commit = revision if revision is not None and _SHA_RE.fullmatch(revision) else None
        self.user_agent, self.attempts, self.pause, self.timeout = user_agent, max(1, attempts), pause, timeout
        self.files: dict[str, HubFile] = {}
        self.bytes_received = 0  # summed over every thread's ranges (``_count_lock``)
        self._count_lock = threading.Lock()

    def _headers(self) -> dict[str, str]:
        from huggingface_hub.utils import build_hf_headers  # lazy: a ~0.2 s import, hub reads only

        return build_hf_headers(user_agent=self.user_agent)

    def info(self, stop: Stop | None = None) -> tuple[str, list[HubFile]]:
        """``(commit, files)`` of the repo at the revision (files sorted by path), the listing
        bounded before it is parsed (``hub.listing.fetch_listing``). Raises ``HubError``
        (gated, missing, a revision not found, no network), ``UnsupportedModelError`` (a
        listing over its bounds), ``HubStopped`` (``stop``)."""
        try:
            info = fetch_listing(endpoint(), self.repo_id, self.revision, self._headers(), self.timeout, stop)
        except (UnsupportedModelError, HubStopped):
            raise
        except Exception as exc:  # huggingface_hub's errors, httpx's, OS errors
            raise HubError(_advice(exc, self.repo_id, self.revision)) from exc
        sha = info.get("sha")
        if not isinstance(sha, str) or not _SHA_RE.fullmatch(sha):
            raise HubError(f"the hub at {endpoint()} gave no commit for model {self.repo_id}")
        self.commit = sha
        files = [HubFile(*sibling_fields(s)) for s in info.get("siblings") or []]
        self.files = {f.path: f for f in files}
        return self.commit, sorted(files, key=lambda f: f.path)

    def get_range(self, path: str, start: int, end: int, stop: Stop | None = None) -> bytes:
        """Bytes ``[start, end)`` of ``path`` at the pinned commit (rules: module docstring).
        Raises ``HubError`` after ``attempts`` failed tries, at once for 401/403/404;
        ``HubStopped`` when ``stop`` says so."""
        parts: list[bytes] = []
        self.stream_range(path, start, end, parts.append, stop)
        return b"".join(parts)

    def stream_range(self, path: str, start: int, end: int, sink: Callable[[bytes], None],
                     stop: Stop | None = None) -> None:
        """Bytes ``[start, end)`` of ``path`` handed to ``sink`` in order as they arrive (a
        dropped connection resumed from the bytes ``sink`` got; rules: module docstring).
        Raises ``HubError`` after ``attempts`` failed tries, at once for 401/403/404; an
        exception ``sink`` raises ends the request and propagates, never retried; so does
        ``HubStopped`` from ``stop`` (checked on every block and before every try)."""
        if self.commit is None:
            self.info(stop)
        if end <= start:
            return
        got = [0]

        def counted(block: bytes) -> None:
            if stop is not None:
                stop.check()
            try:
                sink(block)
            except Exception as exc:  # the caller's, not the hub's
                raise _SinkFailed() from exc
            got[0] += len(block)

        failures: list[str] = []
        pause = self.pause
        while len(failures) < self.attempts:
            try:
                if stop is not None:
                    stop.check()
                self._read(path, start + got[0], end, counted, read_timeout(stop, self.timeout))
                return
            except (HubError, HubStopped):
                raise
            except _SinkFailed as exc:
                raise exc.__cause__ from None  # type: ignore[misc]
            except Exception as exc:  # retried: a 429/5xx, a dropped or refused connection
                failures.append(f"{type(exc).__name__}: {exc}")
                log.info("hub request failed; retrying", repo=self.repo_id, path=path, received=got[0],
                         wanted=end - start, error=failures[-1])
            if len(failures) < self.attempts:
                stop.wait(pause) if stop is not None else time.sleep(pause)
                pause = min(RETRY_PAUSE_MAX, pause * 2)
        raise HubError(f"bytes {start}-{end} of {path} in model {self.repo_id} not received from the hub at "
                       f"{endpoint()} after {len(failures)} tries (last: {failures[-1]}); try again later")

    def _read(self, path: str, start: int, end: int, sink: Callable[[bytes], None], timeout: float) -> None:
        """One ranged GET of ``[start, end)``, its bytes handed to ``sink`` as they arrive."""
        from huggingface_hub import get_session, hf_hub_url  # lazy: a ~0.2 s import, hub reads only

        url = hf_hub_url(self.repo_id, path, revision=self.commit, endpoint=endpoint())
        headers = {**self._headers(), "Range": f"bytes={start}-{end - 1}"}
        with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=timeout) as r:
            if r.status_code in (401, 403, 404):
                raise HubError(_advice(_status_error(r), self.repo_id, self.revision))
            if r.status_code == 429 or r.status_code >= 500 or r.status_code not in (200, 206):
                raise RuntimeError(f"the hub answered {r.status_code}")
            self._check_answer(path, r, start, end)
            skip = start if r.status_code == 200 else 0  # a server ignoring Range: the whole file
            need, got = end - start, 0
            for block in r.iter_bytes():
                if skip:
                    cut = min(skip, len(block))
                    block, skip = block[cut:], skip - cut
                if len(block) > need - got:
                    block = block[: need - got]
                if block:
                    sink(block)
                got += len(block)
                with self._count_lock:  # ranges are read from several threads at once
                    self.bytes_received += len(block)
                if got >= need:
                    return
        raise ConnectionError(f"connection closed after {got} of {need} bytes")

    def _check_answer(self, path: str, r, start: int, end: int) -> None:  # type: ignore[no-untyped-def]
        commit = r.headers.get("x-repo-commit")
        if commit and commit != self.commit:
            raise HubError(f"model {self.repo_id} moved from commit {self.commit} to {commit} while it was "
                           f"fetched; place it again (it will be read at the new commit)")
        expected = self.files.get(path)
        etag = (r.headers.get("x-linked-etag") or "").strip('"').removeprefix("W/").strip('"')
        if expected is not None and expected.sha256 and etag and etag != expected.sha256:
            raise HubError(f"the hub served another object for {path} of model {self.repo_id} "
                           f"({etag[:12]}, not {expected.sha256[:12]}); place it again")


def _status_error(r):  # type: ignore[no-untyped-def]
    """The ``huggingface_hub`` error of a failed response (gated, missing repo, ...), read
    from a bounded part of its body (``hub.listing.status_error``)."""
    return status_error(r)
