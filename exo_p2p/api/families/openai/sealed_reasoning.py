"""Reasoning carried across stateless Responses turns: ``include: ["reasoning.encrypted_content"]``.

A client that stores nothing on the server (``store: false``, as Codex sends every turn) asks
for each ``reasoning`` output item's ``encrypted_content``: an opaque string it sends back in
a later turn's ``input``, where the cluster reads the reasoning again and renders it with
the assistant turn it belongs to (docs/api.md#reasoning-across-turns).

The string is ``exo1.`` and the URL-safe base64 of a 12-byte random nonce and the
ChaCha20-Poly1305 sealing of the reasoning's UTF-8 text (associated data ``AAD``): only a
holder of the key can make one that opens, so a client cannot forge or alter it (a string
that does not open is a 400). The key (``reasoning_key``) is derived with HKDF-SHA256 from the
cluster secret, so every node of a closed cluster reads what any other sealed; without a
secret it is a random key kept in the node's data dir, ``reasoning.key`` (0600), so only that
node reads it. Sizes are bounded: at most ``MAX_REASONING_BYTES`` of text is sealed (longer
reasoning gets no ``encrypted_content``), and a longer string is refused before it is opened.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

PREFIX = "exo1."
AAD = b"exo-p2p reasoning v1"
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
MAX_REASONING_BYTES = 64 * 1024
"""Most UTF-8 bytes of reasoning sealed (the whole conversation travels in a 128 KiB command,
``exo_p2p.api.bounds``, so more could never be sent back)."""
MAX_SEALED_CHARS = len(PREFIX) + (NONCE_BYTES + MAX_REASONING_BYTES + TAG_BYTES + 2) // 3 * 4
"""Longest ``encrypted_content`` opened (characters): the sealing of ``MAX_REASONING_BYTES``."""
KEY_FILE = "reasoning.key"


class SealError(ValueError):
    """An ``encrypted_content`` that this cluster did not make, or that was altered."""


def derive_key(secret: bytes) -> bytes:
    """The sealing key of a cluster secret: HKDF-SHA256, info ``AAD``, 32 bytes."""
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=AAD).derive(secret)


def node_key(data_dir: Path) -> bytes:
    """The node's own sealing key, ``data_dir/reasoning.key``: read, or made (random, 0600)
    when missing or not ``KEY_BYTES`` long. Raises ``OSError`` when it cannot be written."""
    path = data_dir / KEY_FILE
    try:
        key = path.read_bytes()
        if len(key) == KEY_BYTES:
            return key
    except FileNotFoundError:
        pass
    key = os.urandom(KEY_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


def reasoning_key(secret: bytes | None, data_dir: Path) -> bytes:
    """The key of a node: from the cluster ``secret`` when there is one, else ``node_key``."""
    return derive_key(secret) if secret else node_key(data_dir)


def seal(key: bytes, text: str) -> str | None:
    """``text`` sealed as an ``encrypted_content`` string; None when it is longer than
    ``MAX_REASONING_BYTES`` bytes."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) > MAX_REASONING_BYTES:
        return None
    nonce = os.urandom(NONCE_BYTES)
    return PREFIX + base64.urlsafe_b64encode(nonce + ChaCha20Poly1305(key).encrypt(nonce, data, AAD)).decode()


def unseal(key: bytes, sealed: str) -> str:
    """The reasoning text of ``sealed``. Raises ``SealError`` when it is too long, not of
    this form, or does not open with ``key`` (made by another cluster or node, or altered)."""
    if len(sealed) > MAX_SEALED_CHARS:
        raise SealError(f"is {len(sealed)} characters, more than the {MAX_SEALED_CHARS} this server ever makes")
    if not sealed.startswith(PREFIX):
        raise SealError(f"was not made by this server (it does not start with {PREFIX!r})")
    try:
        raw = base64.urlsafe_b64decode(sealed[len(PREFIX):].encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        raise SealError("is not valid base64") from None
    if len(raw) < NONCE_BYTES + TAG_BYTES:
        raise SealError("is too short to be sealed reasoning")
    try:
        data = ChaCha20Poly1305(key).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], AAD)
    except InvalidTag:
        raise SealError("does not open with this cluster's key: it was made by another cluster or node, or altered") from None
    return data.decode("utf-8", "surrogatepass")
