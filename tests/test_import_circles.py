"""No import circles in the runner, the engine, the master and the wire types
(docs/architecture.md#how-to-add-a-kind-of-work): every ``import`` counts, function-local ones
and ``TYPE_CHECKING`` ones included (a circle hidden in a function or a type hint is still two
modules that know each other — the runner's lifecycle and rounds once set the runner's fields
that way). Read from the source with ``ast``: nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("exo_p2p", "master", "worker")
CHECKED = ("worker.", "master.", "exo_p2p.types.")
"""Circles through a module under these prefixes fail the test."""


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of ``PACKAGES`` by dotted name (a package by its own name)."""
    found = {}
    for top in PACKAGES:
        for path in (root / top).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``name`` imports anywhere in its source (a ``from X
    import y`` counts as X.y when that is a module, else X)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in known else base)
    return {m for m in out if m in known and m != name}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, iterative)."""
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
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_the_finder_finds_a_circle_through_a_function_local_import():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_through_the_runner_the_engine_the_master_or_the_types():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert graph["worker.runner.main"], "the import reader found nothing: it is broken"
    bad = [c for c in circles(graph) if any(m.startswith(CHECKED) for m in c)]
    assert bad == []
