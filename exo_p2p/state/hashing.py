"""Canonical encoding and hash of State (docs/architecture.md#log-guarantees: sha256 of the canonical msgpack)."""

from __future__ import annotations

import hashlib

import msgspec

from exo_p2p.types import State

_encoder = msgspec.msgpack.Encoder(order="sorted")


def canonical_bytes(state: State) -> bytes:
    """State as msgpack with every map's keys sorted, so equal States encode equally."""
    return _encoder.encode(state)


def state_hash(state: State) -> str:
    """Hex sha256 of ``canonical_bytes(state)`` (64 characters)."""
    return hashlib.sha256(canonical_bytes(state)).hexdigest()
