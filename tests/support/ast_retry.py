"""``ast.parse`` made safe against one CPython 3.11 fault, for the tests that read the source.

CPython 3.11 keeps the AST converter's recursion counter in per-interpreter state, so a parse
in another thread at the same moment (a server thread a test left running in the same xdist
worker) can leave it out of step; the parse then fails with ``SystemError: AST constructor
recursion depth mismatch`` though the source is fine (CPython gh-106905; seen in CI while
``tests/test_layout.py`` read the test modules). The fault is a race: parsing the same source
again succeeds, while a real error repeats."""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

ATTEMPTS = 3
ORIGINAL = ast.parse


def retrying(parser: Callable[..., ast.AST]) -> Callable[..., ast.AST]:
    """``parser`` (``ast.parse``'s signature) called again, ``ATTEMPTS`` times at most, when it
    raises the mismatch ``SystemError``; any other error, and the mismatch a last time, is raised."""

    def parse(source: Any, *args: Any, **kwargs: Any) -> ast.AST:
        for attempt in range(ATTEMPTS):
            try:
                return parser(source, *args, **kwargs)
            except SystemError as exc:
                if "recursion depth mismatch" not in str(exc) or attempt == ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    return parse


parse = retrying(ORIGINAL)


def install() -> None:
    """Make ``ast.parse`` the retrying one in this process (the test session's conftest)."""
    ast.parse = parse  # type: ignore[assignment]
