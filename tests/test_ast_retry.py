"""The source-reading tests' ``ast.parse`` (``tests.support.ast_retry``): the converter race
is parsed again, a real error is not."""

from __future__ import annotations

import ast

import pytest

from tests.support import ast_retry

pytestmark = pytest.mark.unit
MISMATCH = SystemError("AST constructor recursion depth mismatch (before=141, after=33)")


def test_the_mismatch_is_parsed_again_and_other_errors_are_raised() -> None:
    calls: list[str] = []

    def flaky(source, *args, **kwargs):
        calls.append(source)
        if len(calls) == 1:
            raise MISMATCH
        return ast_retry.ORIGINAL(source)

    assert isinstance(ast_retry.retrying(flaky)("x = 1"), ast.Module) and calls == ["x = 1", "x = 1"]

    def always(source, *args, **kwargs):
        calls.append(source)
        raise MISMATCH

    calls.clear()
    with pytest.raises(SystemError):
        ast_retry.retrying(always)("x = 1")
    assert len(calls) == ast_retry.ATTEMPTS
    with pytest.raises(SyntaxError):
        ast_retry.parse("x = ")


def test_the_session_parses_with_it() -> None:
    assert ast.parse is ast_retry.parse
