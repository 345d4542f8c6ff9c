"""Node identity: an ed25519 key persisted in the node's data dir.

The node id is the libp2p peer id derived from the key, so the same key file always gives the
same node id. The boot id is fresh per process start and lets peers tell a restarted node (same
node id, new boot id) from a duplicate one (same node id, two boot ids alive at once).
"""

from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

import structlog
from libp2p.crypto.ed25519 import Ed25519PrivateKey
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID

log = structlog.get_logger(__name__)

KEY_FILE_NAME = "identity.key"
_KEY_BYTES = 32  # ed25519 seed


class IdentityError(Exception):
    """The key file exists but cannot be used (wrong size, unreadable)."""


@dataclass(frozen=True)
class Identity:
    """A node's key pair and the ids derived from it.

    ``node_id`` is ``str(peer_id)`` (base58, e.g. ``12D3KooW...``).
    """

    key_pair: KeyPair
    peer_id: ID

    @property
    def node_id(self) -> str:
        return str(self.peer_id)


def identity_from_seed(seed: bytes) -> Identity:
    """Build an Identity from a 32-byte ed25519 seed. Raises IdentityError on a bad length."""
    if len(seed) != _KEY_BYTES:
        raise IdentityError(f"identity key must be {_KEY_BYTES} bytes, got {len(seed)}")
    private = Ed25519PrivateKey.from_bytes(seed)
    key_pair = KeyPair(private, private.get_public_key())
    return Identity(key_pair=key_pair, peer_id=ID.from_pubkey(key_pair.public_key))


def load_or_create_identity(data_dir: Path, *, new: bool = False) -> Identity:
    """Load ``data_dir/identity.key`` or create it (and ``data_dir``, mode 0700) if missing.

    The file holds the 32 raw bytes of the ed25519 seed, mode 0600. A file with looser
    permissions is tightened to 0600 and a warning is logged (the key may have been exposed).
    ``new=True`` replaces any existing key with a fresh one (``--new-identity``).
    Raises IdentityError if the file exists but is not a 32-byte key.
    """
    data_dir = Path(data_dir)
    if not data_dir.exists():
        data_dir.mkdir(mode=0o700, parents=True)
    path = data_dir / KEY_FILE_NAME
    if path.exists() and not new:
        _tighten_permissions(path)
        try:
            seed = path.read_bytes()
        except OSError as exc:
            raise IdentityError(f"cannot read identity key {path}: {exc}") from exc
        return identity_from_seed(seed)
    seed = Ed25519PrivateKey.new().to_bytes()
    _write_private(path, seed)
    identity = identity_from_seed(seed)
    log.info("identity created", path=str(path), node_id=identity.node_id, replaced=new)
    return identity


def new_boot_id() -> str:
    """A fresh random id for this process start (32 hex chars)."""
    return secrets.token_hex(16)


def _tighten_permissions(path: Path) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        log.warning(
            "identity key had loose permissions; fixed to 0600",
            path=str(path),
            mode=oct(mode),
        )
        os.chmod(path, 0o600)


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically with mode 0600 (never readable by others)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
