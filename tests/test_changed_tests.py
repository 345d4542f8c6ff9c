"""The changed lane's selection rule (``scripts/changed_tests.py``), on made-up graphs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parent.parent / "scripts" / "changed_tests.py"
_spec = importlib.util.spec_from_file_location("changed_tests", _PATH)
assert _spec is not None and _spec.loader is not None
changed_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(changed_tests)


def test_imports_anywhere_in_a_module_and_relative_ones_are_read() -> None:
    source = (
        "import os\nimport exo_p2p.state.topology\nfrom . import sibling\n"
        "def f():\n    from master.placement import place\n"
    )
    found = changed_tests.imports_of(source, "worker.engine.batch")
    assert found == {
        "exo_p2p.state.topology",
        "worker.engine",
        "worker.engine.sibling",
        "master.placement",
        "master.placement.place",
    }


GRAPH = {
    "exo_p2p": set(),
    "exo_p2p.types": set(),
    "exo_p2p.state": {"exo_p2p.types"},
    "master.placement": {"exo_p2p.state"},
    "tests.support.cluster": set(),
    "tests.test_placement": {"master.placement"},
    "tests.test_types": {"exo_p2p.types"},
    "tests.test_nodes": {"tests.support.cluster"},
}


def _select(changed: set[str]) -> list[str]:
    return [p for p in changed_tests.select(changed, GRAPH)]


def test_a_change_selects_the_tests_that_reach_it_through_imports() -> None:
    assert _select({"exo_p2p/types/__init__.py"}) == ["tests/test_placement.py", "tests/test_types.py"]
    assert _select({"master/placement.py"}) == ["tests/test_placement.py"]
    assert _select({"tests/support/cluster.py"}) == ["tests/test_nodes.py"]
    assert _select({"docs/architecture.md"}) == []


def test_a_changed_test_module_is_selected_and_conftest_selects_all() -> None:
    assert _select({"tests/test_nodes.py"}) == ["tests/test_nodes.py"]
    assert _select({"tests/conftest.py"}) == ["tests/test_nodes.py", "tests/test_placement.py", "tests/test_types.py"]
