"""Digests of a request's prefixes, so the master can route a request to the instance whose
prompt cache holds the longest part of it without ever seeing a token (docs/operations.md).

A request is a chain of units: its messages (role and content), or for a raw prompt its
blocks of ``BLOCK_CHARS`` characters. The digest of the first ``k`` units is chained from
the digest of the first ``k − 1`` (8 bytes of blake2b), so two requests share the digest of
``k`` units exactly when their first ``k`` units are equal. The second turn of a
conversation starts with the first turn's messages, so its chain contains every digest of
the first's.

A runner's prompt cache keeps, per entry, the digests of the ``PER_ENTRY`` longest prefixes
of the request that made it (the longest are the specific ones; a short one such as a
system prompt every request shares tells no replica apart) and publishes at most
``MAX_DIGESTS``, those of the most recently used entries (``worker.engine.prompt_cache``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from exo_p2p.types.tasks import GenerationParams

BLOCK_CHARS = 256
"""Characters per unit of a raw prompt."""
PER_ENTRY = 4
"""Digests a prompt-cache entry keeps (its request's longest prefixes)."""
MAX_DIGESTS = 64
"""Digests a runner publishes at most (about 600 bytes in an event)."""
_SEED = b"exo-p2p prefix v1"


def _digest(previous: bytes, role: str, content: str) -> bytes:
    return hashlib.blake2b(previous + role.encode() + b"\0" + content.encode(), digest_size=8).digest()


def units(params: GenerationParams) -> list[tuple[str, str]]:
    """The units of a request: (role, content) per message, or ("prompt", block) per
    ``BLOCK_CHARS`` characters of a raw prompt (the last block may be shorter)."""
    if params.prompt is not None:
        text = params.prompt
        return [("prompt", text[i:i + BLOCK_CHARS]) for i in range(0, len(text), BLOCK_CHARS)]
    return [(m.role, m.content) for m in params.messages]


def prefix_chain(params: GenerationParams) -> list[tuple[int, int]]:
    """(digest, characters) of each prefix of the request, shortest first: the digest of
    units ``1..k`` (a 63-bit integer) and the characters of their contents."""
    out: list[tuple[int, int]] = []
    previous, chars = _SEED, 0
    for role, content in units(params):
        previous = _digest(previous, role, content)
        chars += len(content)
        out.append((int.from_bytes(previous, "big") >> 1, chars))
    return out


def entry_digests(params: GenerationParams | None) -> tuple[int, ...]:
    """The digests a prompt-cache entry made by ``params`` keeps (``PER_ENTRY`` longest
    prefixes, longest last); () without params."""
    if params is None:
        return ()
    return tuple(d for d, _ in prefix_chain(params)[-PER_ENTRY:])


def bounded(digests: Iterable[int], limit: int = MAX_DIGESTS) -> tuple[int, ...]:
    """``digests`` without repeats (the last occurrence kept), at most ``limit``, the last ones."""
    seen: dict[int, None] = {}
    for d in digests:
        seen.pop(d, None)
        seen[d] = None
    return tuple(seen)[-limit:] if limit > 0 else ()


def longest_match(chain: list[tuple[int, int]], held: Iterable[int]) -> int:
    """Characters of the longest prefix in ``chain`` whose digest is in ``held`` (0: none)."""
    have = set(held)
    best = 0
    for digest, chars in chain:
        if digest in have:
            best = chars
    return best
