"""What a node's profile publishes as held (``NodeProfile.held_models``, docs/models.md): the
rule, pure. One set of files may be held under several names (two dirs with the same bytes,
a model pulled under a second name): their manifests have one digest, and every name is
listed, so every name shows in ``GET /models/cluster`` and can be pulled."""

from __future__ import annotations

from collections.abc import Iterable

from exo_p2p.types.manifest import HeldModel


def held_models(local: Iterable[tuple[str, str]], partials: Iterable[tuple[str, str, bool]]) -> tuple[HeldModel, ...]:
    """Every ``(name, digest)`` of a complete local model, complete; then every partial copy
    ``(name in its manifest, digest, complete)`` under a (name, digest) not listed already.
    Sorted by (name, digest); one entry per pair."""
    out = {(name, digest): True for name, digest in local}
    for name, digest, complete in partials:
        out.setdefault((name, digest), complete)
    return tuple(HeldModel(n, d, c) for (n, d), c in sorted(out.items()))
