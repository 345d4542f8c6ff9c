"""The import graph of ``exo_p2p/``, ``master/`` and ``worker/``, read from the source with ``ast``.

    .venv/bin/python scripts/import_graph.py [--json] [--type-checking]

prints the number of import circles, each circle (its modules and one cycle through them),
the longest import chain and the number of modules per folder. ``tests/test_import_circles.py``
asserts on the same graph.

What counts as an edge (module A imports module B):
- every ``import`` and ``from ... import`` statement anywhere in A's source, the ones inside
  functions included (a function-local import is a circle hidden, not a circle gone); the ones
  under ``if TYPE_CHECKING:`` are left out (they never run, so they cannot make a circle at
  import time; ``from __future__ import annotations`` keeps their names unevaluated);
- ``import a.b.c`` is an edge to ``a.b.c`` (or to its longest prefix that is a module of the
  project, when ``c`` is a name inside ``a.b``); ``from a.b import c`` is an edge to the module
  ``a.b.c`` when ``c`` is one (the same import as ``import a.b.c``), and to ``a.b`` when ``c``
  is a name defined there; relative imports are resolved against A's package first;
- only modules of the three folders are nodes: the standard library and third-party packages
  are left out. A package is the module of its ``__init__.py``; importing ``a.b.c`` is not
  counted as importing ``a`` and ``a.b`` (their ``__init__`` runs, but a package that
  re-exports its modules would otherwise make a circle with each of them).

A circle is a strongly connected component of more than one module. The longest chain is the longest path of the graph with each circle taken as one
stop."""

from __future__ import annotations

import ast
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("exo_p2p", "master", "worker")


def module_files(root: Path = ROOT, folders: tuple[str, ...] = FOLDERS) -> dict[str, Path]:
    """Every module of ``folders`` under ``root`` by dotted name (``a/b/__init__.py`` is ``a.b``)."""
    found: dict[str, Path] = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of import nodes inside an ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) body."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
            if name == "TYPE_CHECKING":
                skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skipped


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """``name`` or its longest dotted prefix that is a module of the project, or None."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path], *, type_checking: bool = False) -> set[str]:
    """The project modules ``module`` (at ``path``) imports, by the rules of this module's
    docstring (``type_checking``: count the imports under ``if TYPE_CHECKING:`` too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = set() if type_checking else _type_checking_only(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {m for alias in node.names if (m := _known(alias.name, modules))}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            submodules = {f"{source}.{alias.name}" for alias in node.names} & modules.keys()
            found |= submodules
            if len(submodules) < len(node.names) and (m := _known(source, modules)) is not None:
                found.add(m)
    found.discard(module)  # ``from . import x`` in a package's __init__ names the package itself
    return found


def import_graph(root: Path = ROOT, folders: tuple[str, ...] = FOLDERS, *,
                 type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the project modules it imports, for every module of ``folders``."""
    modules = module_files(root, folders)
    return {name: imports_of(name, path, modules, type_checking=type_checking) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted, the list sorted (Tarjan's algorithm, iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def one_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One cycle through ``component``'s first module, as modules in import order (first
    repeated at the end): the shortest, found breadth-first inside the component."""
    members, first = set(component), component[0]
    came_from: dict[str, str] = {}
    frontier = [first]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == first:
                    path = [node]
                    while path[-1] != first:
                        path.append(came_from[path[-1]])
                    return list(reversed(path)) + [first]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    return [first, first]


def longest_chain(graph: dict[str, set[str]]) -> list[str]:
    """The longest import chain (A imports B imports C ...), each circle taken as one stop
    (named by its first module)."""
    stop = {m: m for m in graph}
    for component in circles(graph):
        stop.update({m: component[0] for m in component})
    dag: dict[str, set[str]] = {}
    for module, targets in graph.items():
        dag.setdefault(stop[module], set()).update(stop[t] for t in targets if stop[t] != stop[module])
    best: dict[str, list[str]] = {}
    for node in sorted(dag):  # depth-first with an explicit stack, longest path below each stop
        pending = [node]
        while pending:
            top = pending[-1]
            if top in best:
                pending.pop()
                continue
            missing = [c for c in sorted(dag[top]) if c not in best]
            if missing:
                pending.extend(missing)
                continue
            tail = max((best[c] for c in sorted(dag[top])), key=len, default=[])
            best[top] = [top] + tail
            pending.pop()
    return max(best.values(), key=len, default=[])


def modules_per_folder(root: Path = ROOT, folders: tuple[str, ...] = FOLDERS) -> dict[str, int]:
    """Folder (relative to ``root``) -> its flat modules (``.py`` files, ``__init__.py`` included)."""
    counts: Counter[str] = Counter()
    for path in module_files(root, folders).values():
        counts[str(path.parent.relative_to(root))] += 1
    return dict(sorted(counts.items()))


def report(root: Path = ROOT, *, type_checking: bool = False) -> dict:
    """Every figure of this module as one JSON-able dict."""
    graph = import_graph(root, type_checking=type_checking)
    found = circles(graph)
    return {"modules": len(graph), "edges": sum(len(t) for t in graph.values()), "circles": len(found),
            "circle_list": [{"modules": c, "cycle": one_cycle(graph, c)} for c in found],
            "longest_chain": longest_chain(graph), "modules_per_folder": modules_per_folder(root)}


def main(argv: list[str]) -> int:
    figures = report(type_checking="--type-checking" in argv)
    if "--json" in argv:
        print(json.dumps(figures, indent=1))
        return 0
    print(f"modules: {figures['modules']}  import edges: {figures['edges']}")
    print(f"import circles: {figures['circles']}")
    for circle in figures["circle_list"]:
        print(f"  {len(circle['modules'])} modules: {' '.join(circle['modules'])}")
        print(f"    e.g. {' -> '.join(circle['cycle'])}")
    chain = figures["longest_chain"]
    print(f"longest import chain: {len(chain)} modules")
    print("  " + " -> ".join(chain))
    print("modules per folder:")
    for folder, count in figures["modules_per_folder"].items():
        print(f"  {count:4d}  {folder}/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
