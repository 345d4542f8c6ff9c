"""The suite's layout (docs/testing.md "Helpers"): what several test modules share lives in
``tests/support/``, and no test module imports another — not at module level, not inside a
function, not as ``import tests.test_x`` nor ``from tests import test_x``. A test module
that is also a harness makes its users run (and depend on) its tests' module-level setup,
and hides which tests a change selects. The top of tests/ holds test modules only.

And the house's folders stay walkable (docs/architecture.md#layers): no folder of ``exo_p2p/``,
``master/``, ``worker/`` or ``tests/support/`` holds more than ``MAX_FLAT_MODULES`` modules of
its own (its sub-packages' modules are theirs); a folder that grows past it is split by job.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
MAX_FLAT_MODULES = 30
"""The most modules (``__init__.py`` not counted) one folder holds beside its sub-packages."""
FOLDERS = ("exo_p2p", "master", "worker", "tests/support")
TOP_OF_TESTS = {"__init__.py", "conftest.py", "tiers.py"}
"""The modules at the top of tests/ besides the ``test_*.py`` ones."""


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


def test_no_folder_holds_more_than_30_modules() -> None:
    """Every folder of exo_p2p/, master/, worker/ and tests/support/ holds at most 30 modules."""
    crowded = {str(d.relative_to(ROOT)): n for d, n in flat_module_counts().items() if n > MAX_FLAT_MODULES}
    assert crowded == {}, f"split these folders into sub-packages by job: {crowded}"


def test_the_count_sees_every_folder() -> None:
    """The count walks sub-packages (the rule's own check): it sees folders two levels down, and
    the number of modules it finds is every ``.py`` file of the folders, ``__init__.py`` aside."""
    counts = flat_module_counts()
    assert ROOT / "exo_p2p" / "api" / "families" / "openai" in counts
    every = [p for f in FOLDERS for p in (ROOT / f).rglob("*.py") if p.name != "__init__.py" and "__pycache__" not in p.parts]
    assert sum(counts.values()) == len(every)


def test_top_of_tests_holds_only_test_modules() -> None:
    """A helper at the top of tests/ (not ``test_*.py``, conftest or tiers) belongs in tests/support/."""
    helpers = sorted(p.name for p in TESTS.glob("*.py") if not p.name.startswith("test_") and p.name not in TOP_OF_TESTS)
    assert helpers == [], f"move into tests/support/: {helpers}"


def flat_module_counts() -> dict[Path, int]:
    """The number of modules of each folder under ``FOLDERS`` (each folder counted on its own,
    ``__init__.py`` and ``__pycache__`` left out), by the folder's path."""
    counts: dict[Path, int] = {}
    for top in FOLDERS:
        for d in [ROOT / top, *(p for p in (ROOT / top).rglob("*") if p.is_dir())]:
            if "__pycache__" in d.parts or not d.is_dir():
                continue
            counts[d] = sum(1 for p in d.glob("*.py") if p.name != "__init__.py")
    return counts


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
