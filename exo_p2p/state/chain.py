"""Hash chain over the event log: one digest per index that identifies the whole log up to it.

Log matching by ``(idx, term)`` alone assumes a term belongs to one master. Terms are claimed
without votes (``exo_p2p.cluster.election``), so two nodes that were cut off from each other
can both claim the same term (a restarted master alone for the settle time claims
``term + 1`` while the others already elected someone at ``term + 1``), and then two
different logs hold different events under equal ``(idx, term)`` pairs. A follower that
compared only terms would append one master's events to the other's prefix and its State
would differ forever. The chain digest at ``idx`` depends on every event up to ``idx`` (and
on the State a log starts from after compaction), so equal digests mean equal logs and a
divergence is seen however the terms collide (scripts/chaos.py produced such a collision).

``chain[base] = sha256(canonical State at base)[:16]`` (base 0: the empty State), and
``chain[i] = blake2b(chain[i-1] + msgpack(event i), 16 bytes)``. Pure functions.
"""

from __future__ import annotations

import hashlib

import msgspec

from exo_p2p.state.hashing import canonical_bytes
from exo_p2p.types import IndexedEvent, State

DIGEST_BYTES = 16
_encoder = msgspec.msgpack.Encoder(order="sorted")


def chain_base(state: State) -> bytes:
    """The chain digest of a log that starts from ``state`` (its ``last_event_idx`` is the
    base index): the first 16 bytes of the sha256 of its canonical encoding."""
    return hashlib.sha256(canonical_bytes(state)).digest()[:DIGEST_BYTES]


def chain_step(prev: bytes, event: IndexedEvent) -> bytes:
    """The digest after appending ``event`` to a log whose digest is ``prev`` (16 bytes)."""
    return hashlib.blake2b(prev + _encoder.encode(event), digest_size=DIGEST_BYTES).digest()
