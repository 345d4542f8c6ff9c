"""Cluster secrets: a random 32-byte key, hex-encoded, shared by every node of a cluster."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

SECRET_BYTES = 32


def new_cluster_secret() -> str:
    """A fresh secret: ``SECRET_BYTES`` random bytes as 64 lower-case hex digits."""
    return secrets.token_hex(SECRET_BYTES)


def write_cluster_secret(path: Path, *, force: bool = False) -> str:
    """Write a new secret (and a newline) to ``path`` with mode 0600 and return it.

    The file is created 0600 from the start (never readable by others, whatever the umask).
    Raises ``FileExistsError`` when ``path`` exists and ``force`` is false (a secret in use
    must not be replaced by accident), ``OSError`` for other failures.
    """
    secret = new_cluster_secret()
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (secret + "\n").encode())
    finally:
        os.close(fd)
    return secret
