"""An image's bytes from the node whose API read them, point to point (docs/architecture.md#request-flow).

``IMAGE_PROTOCOL`` is a request/response protocol on the node's libp2p host
(``exo_p2p.net.reqresp``): the request is the image's sha256 digest (64 hex characters), the
reply its bytes from ``NODE_IMAGES`` (``exo_p2p.vision.store``); an image not held is a remote
error. ``image_bytes`` is the fetching side: the local store first, else the API node, within
``FETCH_SECONDS``; the reply is kept only when its sha256 is the digest asked for. Only cluster
members (authenticated by the host) can ask, and only for a digest they already know from the
log, which cannot be guessed.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import structlog
import trio

from exo_p2p.vision.image import MAX_IMAGE_BYTES
from exo_p2p.vision.store import NODE_IMAGES, ImageStore

log = structlog.get_logger(__name__)

IMAGE_PROTOCOL = "/exo-p2p/image-bytes/1"
"""The protocol serving a node's held images by digest."""
FETCH_SECONDS = 15.0
"""Seconds one image's fetch from a peer may take in all (10 MiB at ~1 MB/s, and a dial)."""
_DIGEST = re.compile(r"[0-9a-f]{64}")


async def serve_image(store: ImageStore, _peer: str, request: bytes) -> bytes:
    """The reply to one ``IMAGE_PROTOCOL`` request. Raises ``ValueError`` (a remote error at
    the asking node) for a malformed digest or an image this node does not hold."""
    digest = request.decode("ascii", errors="replace")
    if not _DIGEST.fullmatch(digest):
        raise ValueError("an image request is a sha256 digest in 64 lowercase hex characters")
    data = store.get(digest)
    if data is None:
        raise ValueError(f"image {digest[:12]} is not held here (expired or evicted)")
    return data


def register(net: Any, store: ImageStore = NODE_IMAGES) -> None:
    """Serve ``IMAGE_PROTOCOL`` from ``store`` on ``net`` (an ``exo_p2p.net.Network``)."""
    net.set_request_handler(IMAGE_PROTOCOL, lambda peer, request: serve_image(store, peer, request))


async def image_bytes(net: Any, self_id: str, api_node_id: str, digest: str, store: ImageStore = NODE_IMAGES) -> bytes | None:
    """The bytes of ``digest``: from ``store``, else from ``api_node_id`` over ``net`` (kept in
    ``store`` once their sha256 matches); None when neither has them in time (logged)."""
    data = store.get(digest)
    if data is not None or api_node_id == self_id or net is None:
        return data
    try:
        with trio.fail_after(FETCH_SECONDS):
            data = await net.request(api_node_id, IMAGE_PROTOCOL, digest.encode(), timeout=FETCH_SECONDS)
    except Exception as exc:  # noqa: BLE001 - any failure means the image is not available
        log.warning("image fetch failed", digest=digest[:12], api_node=api_node_id[:12], error=str(exc)[:200])
        return None
    if len(data) > MAX_IMAGE_BYTES or hashlib.sha256(data).hexdigest() != digest:
        log.warning("image fetch gave other bytes", digest=digest[:12], api_node=api_node_id[:12])
        return None
    store.put(digest, data)
    return data
