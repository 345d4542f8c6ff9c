"""The suite's layout (docs/testing.md "Helpers"): what several test modules share lives in
``tests/support/``, and no test module imports another — not at module level, not inside a
function, not as ``import tests.test_x`` nor ``from tests import test_x``. A test module
that is also a harness makes its users run (and depend on) its tests' module-level setup,
and hides which tests a change selects.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_the_check_finds_every_form_of_import() -> None:
    """``imported_test_modules`` finds every form of importing a test module (the rule's own check)."""
    source = (
        "import tests.test_a\n"
        "from tests.test_b import x\n"
        "from tests import test_c, support\n"
        "from tests.dashboard.test_d import y\n"
        "from tests.support.cluster import NodeProcess\n"
        "def f():\n"
        "    from tests.test_e import z\n"
    )
    assert imported_test_modules(source) == {"tests.test_a", "tests.test_b", "tests.test_c", "tests.dashboard.test_d", "tests.test_e"}


def test_no_test_module_imports_another() -> None:
    """Every ``test_*.py`` under tests/ imports no ``test_*`` module; helpers are in tests/support/."""
    offenders = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        found = imported_test_modules(path.read_text())
        if found:
            offenders[str(path.relative_to(TESTS.parent))] = sorted(found)
    assert offenders == {}, f"move what they share into tests/support/: {offenders}"


def test_support_holds_no_tests() -> None:
    """tests/support/ is helpers only: no ``test_*.py`` module pytest would collect there."""
    assert sorted(p.name for p in (TESTS / "support").glob("test_*.py")) == []


def imported_test_modules(source: str) -> set[str]:
    """The ``tests.…test_*`` modules ``source`` imports anywhere (module level or in a function)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if _is_test_module(a.name)}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _is_test_module(node.module):
                found.add(node.module)
            elif node.module.split(".")[0] == "tests":
                found |= {f"{node.module}.{a.name}" for a in node.names if a.name.startswith("test_")}
    return found


def _is_test_module(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "tests" and parts[-1].startswith("test_")
