"""No import circles in ``exo_p2p/``, ``master/`` or ``worker/``: the graph ``scripts/import_graph.py``
reads from the source (imports inside functions counted; imports under ``if TYPE_CHECKING:``
left out, since they never run; that module's docstring gives every rule of an edge).

Any circle fails, with one concrete cycle of it in the message."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parent.parent / "scripts" / "import_graph.py"
_spec = importlib.util.spec_from_file_location("import_graph", _PATH)
assert _spec is not None and _spec.loader is not None
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)

def _write(root: Path, files: dict[str, str]) -> None:
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)


def test_no_import_circles() -> None:
    graph = import_graph.import_graph()
    found = sorted(" -> ".join(import_graph.one_cycle(graph, c)) for c in import_graph.circles(graph))
    assert not found, f"import circles: {found}"


def test_function_local_and_relative_imports_make_circles(tmp_path: Path) -> None:
    _write(tmp_path, {
        "exo_p2p/__init__.py": "",
        "exo_p2p/a.py": "from exo_p2p.b import thing\n",
        "exo_p2p/b.py": "def f():\n    from .c import other\n",
        "exo_p2p/c.py": "import exo_p2p.a\n",
        "exo_p2p/d.py": "from exo_p2p import a\n",
        "master/__init__.py": "", "worker/__init__.py": "",
    })
    graph = import_graph.import_graph(tmp_path)
    assert graph["exo_p2p.b"] == {"exo_p2p.c"} and graph["exo_p2p.d"] == {"exo_p2p.a"}
    assert import_graph.circles(graph) == [["exo_p2p.a", "exo_p2p.b", "exo_p2p.c"]]
    assert import_graph.one_cycle(graph, ["exo_p2p.a", "exo_p2p.b", "exo_p2p.c"]) == [
        "exo_p2p.a", "exo_p2p.b", "exo_p2p.c", "exo_p2p.a"]
    assert import_graph.longest_chain(graph) == ["exo_p2p.d", "exo_p2p.a"]


def test_type_checking_imports_are_left_out_and_a_package_name_is_an_edge(tmp_path: Path) -> None:
    _write(tmp_path, {
        "exo_p2p/__init__.py": "",
        "exo_p2p/p/__init__.py": "from exo_p2p.p.inner import X\n",
        "exo_p2p/p/inner.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from exo_p2p.q import Q\nX = 1\n",
        "exo_p2p/q.py": "from exo_p2p.p import X\nimport exo_p2p.p.inner.X_ATTR\n",
        "master/__init__.py": "", "worker/__init__.py": "",
    })
    graph = import_graph.import_graph(tmp_path)
    assert graph["exo_p2p.p.inner"] == set() and graph["exo_p2p.q"] == {"exo_p2p.p", "exo_p2p.p.inner"}
    assert import_graph.circles(graph) == []
    assert import_graph.circles(import_graph.import_graph(tmp_path, type_checking=True)) == [
        ["exo_p2p.p", "exo_p2p.p.inner", "exo_p2p.q"]]
    assert import_graph.longest_chain(graph) == ["exo_p2p.q", "exo_p2p.p", "exo_p2p.p.inner"]


def test_no_circles_through_the_roles_and_wire_types_even_in_type_hints() -> None:
    """The runner, the engine, the master and the wire types stay circle-free with ``TYPE_CHECKING``
    imports counted too: a circle hidden in a type hint is still two modules that know each other
    (the runner's lifecycle and rounds once set the runner's fields that way)."""
    graph = import_graph.import_graph(type_checking=True)
    checked = ("worker.", "master.", "exo_p2p.types.")
    found = sorted(" -> ".join(import_graph.one_cycle(graph, c)) for c in import_graph.circles(graph)
                   if any(m.startswith(checked) for m in c))
    assert not found, f"import circles: {found}"
