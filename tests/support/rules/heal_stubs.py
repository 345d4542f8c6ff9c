"""Stubs of a replica for the heal rule's tests."""

from __future__ import annotations

from types import SimpleNamespace


async def _noop(*_a):  # type: ignore[no-untyped-def]
    return None


def _stub_replica(nodes: list[str]):  # type: ignore[no-untyped-def]
    state = SimpleNamespace(term=0, nodes={n: None for n in nodes})
    return SimpleNamespace(
        state=state, listeners=[], snapshot_listeners=[], last_idx=0, last_term=0, defer_sync=False, chain_at=lambda i: None
    )
