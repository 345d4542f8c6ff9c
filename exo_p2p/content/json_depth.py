"""How deep arrays and objects nest in decoded JSON, measured without recursion.

Python's JSON decoder, encoder and most code walking a document recurse once per level, so a
document nested tens of thousands of levels deep raises ``RecursionError`` wherever it goes.
The places that take JSON from a client or a model source bound the depth with
:func:`json_depth` (``exo_p2p.api.families.tool_calls.MAX_JSON_DEPTH``,
``exo_p2p.models.model_json.MAX_MODEL_JSON_DEPTH``; docs/security.md).
"""

from __future__ import annotations

from typing import Any


def json_depth(value: Any) -> int:
    """How deep arrays and objects nest in ``value`` (a scalar: 0, ``{}``: 1, ``[[1]]``: 2).
    Iterative, so any depth is measured. Pure."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, (list, tuple)) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest
