"""Closed-cluster membership kept in the data dir: ``--join TOKEN``, the stored secret, ``invite``.

Files in the node's data dir (mode 0600):

- ``cluster.secret``: the cluster secret, in the format of ``exo-p2p cluster-secret FILE``
  (so ``--cluster-secret DATA_DIR/cluster.secret`` is the same thing);
- ``cluster.name``: the cluster name that goes with it (part of the PSK).

Rules (``resolve_membership``), in order:

1. ``--join TOKEN``: the token's secret and cluster name are stored, its addresses are
   added to the bootstrap list; ``--cluster-secret`` with it is a usage error, and so is a
   ``--cluster`` other than the token's.
2. ``--cluster-secret FILE``: used, and a copy stored (replacing a stored one), with
   ``--cluster`` (or the stored name, else ``default``).
3. Neither: a stored secret is used, with the stored cluster name unless ``--cluster`` is
   given — so a node that joined, or was once started with ``--cluster-secret``, needs no
   flag later.
4. Nothing stored: the cluster is open (``OPEN_CLUSTER_NOTICE`` says how to close it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from exo_p2p.net.config import OPEN_CLUSTER_NOTICE
from exo_p2p.net.join_token import JoinToken, TokenError, decode_token, encode_token

SECRET_FILE = "cluster.secret"
NAME_FILE = "cluster.name"



class MembershipError(ValueError):
    """A usage error in the membership flags (one line)."""


@dataclass(frozen=True)
class Membership:
    """What the node starts with: ``secret_file`` (None: open cluster), ``cluster`` (None:
    the default), extra ``bootstrap`` addresses (from a join token)."""

    secret_file: Path | None
    cluster: str | None
    bootstrap: tuple[str, ...] = ()


def stored_secret_file(data_dir: Path) -> Path | None:
    path = data_dir / SECRET_FILE
    return path if path.is_file() else None


def stored_cluster_name(data_dir: Path) -> str | None:
    path = data_dir / NAME_FILE
    try:
        name = path.read_text().strip()
    except OSError:
        return None
    return name or None


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def store(data_dir: Path, secret: bytes, cluster: str) -> Path:
    """Store ``secret`` and ``cluster`` in ``data_dir`` (mode 0600); returns the secret file.
    Raises OSError when the data dir is not writable."""
    path = data_dir / SECRET_FILE
    _write_private(path, secret + b"\n")
    _write_private(data_dir / NAME_FILE, cluster.encode() + b"\n")
    return path


def resolve_membership(data_dir: Path, *, join: str | None, secret_file: Path | None, cluster: str | None) -> Membership:
    """The rules of the module docstring. Raises MembershipError (bad or conflicting
    flags, a damaged token) or OSError (the data dir cannot be written)."""
    if join is not None:
        if secret_file is not None:
            raise MembershipError("--join and --cluster-secret do not go together (the token holds the secret)")
        try:
            token = decode_token(join)
        except TokenError as e:
            raise MembershipError(f"--join: {e}") from None
        if cluster is not None and cluster != token.cluster:
            raise MembershipError(f"--cluster {cluster!r} is not the invited cluster {token.cluster!r}; drop --cluster")
        path = store(data_dir, token.secret, token.cluster)
        return Membership(path, token.cluster, token.addrs)
    if secret_file is not None:
        name = cluster or stored_cluster_name(data_dir) or "default"
        store(data_dir, secret_file.read_bytes().strip(), name)
        return Membership(secret_file, cluster)
    stored = stored_secret_file(data_dir)
    if stored is not None:
        return Membership(stored, cluster or stored_cluster_name(data_dir))
    return Membership(None, cluster)


def make_invite(data_dir: Path, addrs: list[str]) -> str:
    """The join token for the member whose data dir is ``data_dir`` and whose dialable
    addresses are ``addrs`` (non-loopback first). Raises MembershipError when the data dir
    holds no secret (an open cluster: the message says how to close it) or no address is
    given."""
    secret_file = stored_secret_file(data_dir)
    if secret_file is None:
        raise MembershipError(f"no cluster secret in {data_dir}: {OPEN_CLUSTER_NOTICE}")
    if not addrs:
        raise MembershipError("the node reports no address to join it at")
    ordered = sorted(addrs, key=lambda a: a.startswith(("/ip4/127.", "/ip6/::1/")))
    secret = secret_file.read_bytes().strip()
    try:
        return encode_token(JoinToken(stored_cluster_name(data_dir) or "default", secret, tuple(ordered)))
    except TokenError as e:
        raise MembershipError(f"{secret_file}: {e}") from None
