"""Join tokens: what a new machine needs to join a closed cluster, in one pasteable string.

Format (version 1): ``exo1_`` + base64url without padding of
``msgpack([cluster, secret, [addr, ...]]) + sha256(that msgpack)[:4]``.

- ``cluster``: the cluster name (``--cluster``), part of the PSK derivation;
- ``secret``: the cluster secret bytes exactly as nodes read them from a
  ``--cluster-secret`` file (surrounding whitespace stripped);
- ``addr``: the inviting member's dialable multiaddrs (``/ip4/…/tcp/…/p2p/<node id>``).

The 4-byte checksum catches a token cut or mistyped when pasted. The prefix carries the
version: a future format gets another prefix, and this decoder names it in its error. The
token holds the secret: whoever has it can join, so pass it like a password.
"""

from __future__ import annotations

import base64
import hashlib

import msgspec

from exo_p2p.net.config import ConfigError, validate_cluster_name, validate_secret

TOKEN_PREFIX = "exo1_"
MAX_TOKEN_CHARS = 16384


class TokenError(ValueError):
    """A join token that cannot be used (the message says why, in one line)."""


class JoinToken(msgspec.Struct, frozen=True, array_like=True):
    cluster: str
    secret: bytes
    addrs: tuple[str, ...]


def encode_token(token: JoinToken) -> str:
    """The token's text. Raises TokenError for an invalid cluster name or secret."""
    _validate(token)
    payload = msgspec.msgpack.encode(token)
    raw = payload + hashlib.sha256(payload).digest()[:4]
    return TOKEN_PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_token(text: str) -> JoinToken:
    """Parse a token made by ``encode_token``. Raises TokenError (another version, not
    base64url, damaged, or holding an invalid name, secret or no address)."""
    text = text.strip()
    if len(text) > MAX_TOKEN_CHARS:
        raise TokenError(f"join token too long ({len(text)} characters)")
    if not text.startswith(TOKEN_PREFIX):
        head = text.split("_", 1)[0] if "_" in text[:8] else ""
        if head.startswith("exo") and head[3:].isdigit():
            raise TokenError(f"join token of version {head[3:]}; this exo-p2p reads version 1 (upgrade it)")
        raise TokenError(f"not a join token (it starts with {TOKEN_PREFIX!r}; make one with `exo-p2p invite` on a member)")
    body = text[len(TOKEN_PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (ValueError, TypeError):
        raise TokenError("join token is damaged (not base64url); copy it again") from None
    payload, check = raw[:-4], raw[-4:]
    if len(raw) < 5 or hashlib.sha256(payload).digest()[:4] != check:
        raise TokenError("join token is damaged (checksum mismatch); copy it again")
    try:
        token = msgspec.msgpack.decode(payload, type=JoinToken)
    except msgspec.DecodeError as e:
        raise TokenError(f"join token is damaged ({e})") from None
    _validate(token)
    return token


def _validate(token: JoinToken) -> None:
    try:
        validate_cluster_name(token.cluster)
        validate_secret(token.secret)
    except ConfigError as e:
        raise TokenError(f"join token: {e}") from None
    if not token.addrs:
        raise TokenError("join token lists no member address")
