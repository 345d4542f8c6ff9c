"""A repo's file listing read from a hub with its size bounded before it is parsed
(docs/security.md): ``/api/models/REPO[/revision/REV]?blobs=true`` (what
``HfApi.model_info(files_metadata=True)`` asks), streamed, refused past
``hub_limits.MAX_LISTING_BYTES``, then parsed and its sibling count checked
(``MAX_REPO_FILES``) before any ``HubFile`` is made. Blocking: run it in a thread.
"""

from __future__ import annotations

import json
from urllib.parse import quote

from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.hub.stop import Stop, read_timeout
from exo_p2p.models.hub_limits import MAX_LISTING_BYTES, check_sibling_count


MAX_ERROR_BYTES = 65536
"""Bytes of an error answer's body read at most (its message)."""


def listing_url(base: str, repo_id: str, revision: str | None) -> str:
    """The model-info URL of ``repo_id`` at ``revision`` (None: the default branch) on hub ``base``."""
    url = f"{base}/api/models/{repo_id}"
    return url + (f"/revision/{quote(revision, safe='')}" if revision is not None else "")


def fetch_listing(base: str, repo_id: str, revision: str | None, headers: dict[str, str], timeout: float,
                  stop: Stop | None = None) -> dict:
    """The parsed model info of ``repo_id`` (a dict with ``sha`` and ``siblings``). Raises
    ``UnsupportedModelError`` for an answer over ``MAX_LISTING_BYTES``, not a JSON object, or
    naming more than ``MAX_REPO_FILES`` siblings; ``huggingface_hub``'s errors for a refused
    request (``hf_raise_for_status``); ``HubStopped`` when ``stop`` says so; httpx's errors."""
    from huggingface_hub import get_session  # lazy: a ~0.2 s import, hub reads only

    if stop is not None:
        stop.check()
    parts, got = [], 0
    with get_session().stream("GET", listing_url(base, repo_id, revision), params={"blobs": "true"},
                              headers=headers, follow_redirects=True, timeout=read_timeout(stop, timeout)) as r:
        if r.status_code >= 400:
            raise status_error(r, stop)
        for block in r.iter_bytes():
            if stop is not None:
                stop.check()
            got += len(block)
            if got > MAX_LISTING_BYTES:
                raise UnsupportedModelError(f"the hub's file listing of {repo_id} is more than the limit of "
                                            f"{MAX_LISTING_BYTES} bytes (MAX_LISTING_BYTES)")
            parts.append(block)
    try:
        data = json.loads(b"".join(parts))
    except ValueError as e:
        raise UnsupportedModelError(f"the hub's file listing of {repo_id} is not JSON ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("siblings") or [], list):
        raise UnsupportedModelError(f"the hub's file listing of {repo_id} is not a model info object")
    check_sibling_count(len(data.get("siblings") or []))
    return data


def sibling_fields(s: object) -> tuple[str, int, str, str]:
    """``(path, size, lfs sha256 or "", blob id or "")`` of one listed sibling. Raises
    ``UnsupportedModelError`` for one that is not shaped as the hub gives them."""
    if not isinstance(s, dict) or not isinstance(s.get("rfilename"), str):
        raise UnsupportedModelError(f"the hub's file listing has a malformed entry: {str(s)[:100]}")
    lfs = s.get("lfs") if isinstance(s.get("lfs"), dict) else {}
    size = s.get("size") if s.get("size") is not None else lfs.get("size", 0)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise UnsupportedModelError(f"the hub's file listing gives {s['rfilename'][:200]} the size {str(size)[:50]}")
    return s["rfilename"], size, str(lfs.get("sha256") or ""), str(s.get("blobId") or "")


def status_error(r, stop: Stop | None = None) -> Exception:  # type: ignore[no-untyped-def]
    """The ``huggingface_hub`` error (gated, missing repo, revision not found, ...) of a
    failed streamed response ``r``, read from at most ``MAX_ERROR_BYTES`` of its body: a
    hostile server's endless error answer is not read whole."""
    from huggingface_hub.utils import hf_raise_for_status  # lazy: a ~0.2 s import, hub reads only

    body = b""
    for block in r.iter_bytes():
        if stop is not None:
            stop.check()
        body += block[:MAX_ERROR_BYTES - len(body)]
        if len(body) >= MAX_ERROR_BYTES:
            break
    headers = {k: v for k, v in r.headers.items() if k.lower() not in ("content-encoding", "content-length",
                                                                       "transfer-encoding")}
    try:
        # the session's own Response class (huggingface_hub's HTTP client), with the bounded body
        hf_raise_for_status(type(r)(r.status_code, headers=headers, content=body, request=r.request))
    except Exception as exc:
        return exc
    return RuntimeError(f"status {r.status_code}")
