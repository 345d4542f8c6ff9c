"""Fetching an image URL a client sent, only when the node allows it (``--allow-image-urls``).

``fetch_image(url, policy)`` resolves the host, refuses private, loopback, link-local,
multicast and reserved addresses unless ``policy.allow_private`` (``--allow-private-image-urls``),
then connects to the address it checked (the ``Host`` header and TLS server name stay the
URL's host, so a second DNS answer cannot point the request elsewhere), follows no redirect,
and stops at ``MAX_IMAGE_BYTES`` or ``policy.timeout`` seconds in all. Raises
``ImageError`` with the reason. Why these bounds: docs/security.md "Image URLs".
"""

from __future__ import annotations

import ipaddress
import socket
import time
from urllib.parse import urlsplit, urlunsplit

import msgspec

from exo_p2p.vision.image import MAX_IMAGE_BYTES, ImageError

FETCH_TIMEOUT = 10.0
"""Seconds one image URL may take in all (resolve, connect, headers, body)."""
MAX_URL_CHARS = 2048
"""Characters of an image URL at most."""


class ImageUrlPolicy(msgspec.Struct, frozen=True):
    """Whether image URLs are fetched (``allow``), also from private and loopback addresses
    (``allow_private``), and the time one fetch may take (seconds)."""

    allow: bool = False
    allow_private: bool = False
    timeout: float = FETCH_TIMEOUT


def check_address(address: str, allow_private: bool) -> None:
    """Raise ``ImageError`` when ``address`` (an IP) is not a public unicast address and
    ``allow_private`` is false."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if allow_private:
        return
    if not ip.is_global or ip.is_multicast:
        raise ImageError(f"image URL resolves to {ip}, a private, loopback or reserved address: refused "
                         "(a node allows those with --allow-private-image-urls)")


def _resolve(host: str, port: int, allow_private: bool) -> str:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise ImageError(f"image URL host {host[:200]!r} does not resolve: {exc}") from None
    addresses = [str(info[4][0]) for info in infos]
    for address in addresses:  # every answer checked: the connection may use any of them
        check_address(address, allow_private)
    return addresses[0]


def fetch_image(url: str, policy: ImageUrlPolicy) -> bytes:
    """The bytes at ``url`` (http or https; see the module docstring). Raises ``ImageError``."""
    import httpx

    if not policy.allow:
        raise ImageError("image URLs are not fetched by this node: send the image as base64 data "
                         "(a data URL), or start the node with --allow-image-urls")
    if len(url) > MAX_URL_CHARS:
        raise ImageError(f"image URL is over {MAX_URL_CHARS} characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ImageError("image URL must be http(s)://host/... or a data URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    deadline = time.monotonic() + policy.timeout
    address = _resolve(parts.hostname, port, policy.allow_private)
    literal = f"[{address}]" if ":" in address else address
    pinned = urlunsplit((parts.scheme, f"{literal}:{port}", parts.path or "/", parts.query, ""))
    headers = {"Host": parts.netloc.rpartition("@")[2], "Accept": "image/*"}
    try:
        with httpx.Client(timeout=policy.timeout, follow_redirects=False, trust_env=False) as client:
            with client.stream("GET", pinned, headers=headers, extensions={"sni_hostname": parts.hostname}) as response:
                if response.status_code != 200:
                    raise ImageError(f"image URL answered HTTP {response.status_code} (redirects are not followed)")
                return _read_bounded(response, deadline)
    except httpx.HTTPError as exc:
        raise ImageError(f"image URL could not be fetched: {type(exc).__name__}: {str(exc)[:200]}") from None


def _read_bounded(response, deadline: float) -> bytes:  # noqa: ANN001 - an httpx.Response being streamed
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_IMAGE_BYTES:
        raise ImageError(f"image URL's body is {declared} bytes, over the limit of {MAX_IMAGE_BYTES}")
    body = bytearray()
    for piece in response.iter_bytes():
        body += piece
        if len(body) > MAX_IMAGE_BYTES:
            raise ImageError(f"image URL's body is over the limit of {MAX_IMAGE_BYTES} bytes")
        if time.monotonic() > deadline:
            raise ImageError("image URL took longer than the fetch time limit")
    return bytes(body)
