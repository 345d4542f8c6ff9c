"""Run the tests a change touches (docs/testing.md, "The changed lane").

    .venv/bin/python scripts/changed_tests.py [--base REV] [--list] [PYTEST ARGS...]

The change is what git reports against ``--base`` plus untracked files it does not ignore.
The default base is where the current branch left ``main`` (so a branch's committed work is
included), or ``HEAD`` (the uncommitted change) on ``main`` itself or without a ``main``. A test module is selected when

- it is itself changed, or
- it imports, directly or through the project's own modules, a module that changed
  (imports are read from the source with ``ast``, also those inside functions), or
- a shared test file it imports changed (``tests/support/cluster.py``, ``tests/support/rules/strategies.py``...).

A change to ``tests/conftest.py``, ``tests/tiers.py`` or ``pyproject.toml`` selects every
test module. Integration tests that start nodes as processes run product code they do not
import; the import graph still finds most of them (they import the types and rules they
check), but the full suite is what proves a change. ``--list`` prints the selection and
runs nothing. Other arguments go to pytest (e.g. ``-m unit``, ``-n 2``); exit code is
pytest's, or 0 with a message when nothing is selected.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("exo_p2p", "master", "worker", "tests")
EVERYTHING = {"tests/conftest.py", "tests/tiers.py", "pyproject.toml", "tests/dashboard/conftest.py"}
"""Files whose change selects every test module."""


def changed_files(base: str) -> set[str]:
    """Paths (relative to the repository, POSIX) changed since ``base`` plus untracked ones.

    Raises ``subprocess.CalledProcessError`` when git does not know ``base``."""

    def git(*args: str) -> list[str]:
        out = subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout
        return [line for line in out.splitlines() if line]

    return set(git("diff", "--name-only", base)) | set(git("ls-files", "--others", "--exclude-standard"))


def default_base() -> str:
    """The merge base of ``HEAD`` and ``main`` when it differs from ``HEAD``, else ``"HEAD"``."""
    found = subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=ROOT, capture_output=True, text=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    base = found.stdout.strip()
    return base if found.returncode == 0 and base and base != head.stdout.strip() else "HEAD"


def module_name(path: str) -> str | None:
    """``exo_p2p/api/app.py`` → ``exo_p2p.api.app`` (a package's ``__init__.py`` → the
    package); None for a file outside the project's packages or not Python."""
    parts = Path(path).with_suffix("").parts
    if not path.endswith(".py") or not parts or parts[0] not in PACKAGES:
        return None
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(source: str, name: str) -> set[str]:
    """The project modules ``source`` (the module ``name``) imports, anywhere in it:
    ``import a.b``, ``from a.b import c`` (both ``a.b`` and ``a.b.c``, since ``c`` may be a
    module), relative imports resolved against ``name``."""
    found: set[str] = set()
    package = name.rsplit(".", 1)[0] if "." in name else name
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m.split(".")[0] in PACKAGES}


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module name → the project modules it imports, for every ``.py`` file of the packages."""
    graph: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            name = module_name(path.relative_to(root).as_posix())
            if name is not None:
                graph[name] = imports_of(path.read_text(encoding="utf-8"), name)
    return graph


def reaches(graph: dict[str, set[str]], start: str, targets: set[str]) -> bool:
    """Whether ``start`` imports any of ``targets``, directly or through other modules of
    ``graph``. Importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py`` too, so it
    counts as importing ``a`` and ``a.b``; importing a package never counts as importing
    all its modules."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        if current != start and current in targets:
            return True
        for imported in graph.get(current, ()):
            parts = imported.split(".")
            todo.extend(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return False


def select(changed: set[str], graph: dict[str, set[str]]) -> list[str]:
    """The test module paths (``tests/.../test_*.py``) a change touches, sorted."""
    tests = sorted(
        name for name in graph if name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_")
    )
    as_path = {name: name.replace(".", "/") + ".py" for name in tests}
    if changed & EVERYTHING:
        return [as_path[name] for name in tests]
    modules = {m for m in map(module_name, changed) if m is not None}
    picked = [name for name in tests if as_path[name] in changed or reaches(graph, name, modules)]
    return [as_path[name] for name in picked]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default=None, help="what the change is against (default: where this branch left main)")
    parser.add_argument("--list", action="store_true", help="print the selected test modules only")
    args, pytest_args = parser.parse_known_args(argv)
    args.base = args.base or default_base()
    selected = [p for p in select(changed_files(args.base), import_graph(ROOT)) if (ROOT / p).exists()]
    if args.list or not selected:
        print("\n".join(selected) if selected else f"no test module is touched by the change since {args.base}")
        return 0
    print(f"{len(selected)} test modules touched by the change since {args.base}", file=sys.stderr)
    pytest = str(Path(sys.executable).with_name("pytest"))
    os.chdir(ROOT)
    return subprocess.call([pytest, "-p", "no:cacheprovider", *pytest_args, *selected])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
