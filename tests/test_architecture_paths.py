"""docs/architecture.md names only paths that exist: every ``path/like/this.py`` (and every
``folder/like/this/``) it puts in backticks is a file (folder) of the repository, read from the
root or, for the short forms the page uses, from inside ``exo_p2p/``, ``master/`` or ``worker/``
(``api/routes.py`` is ``exo_p2p/api/routes.py``, ``engine/text.py`` is ``worker/engine/text.py``).
A move that forgets the map fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
BASES = ("", "exo_p2p/", "master/", "worker/")
"""Where a path the page names may start: the root, or inside one of the three code folders."""
PATH = re.compile(r"^[\w.-]+(?:/[\w.-]+)+(?:\.py|/)$")
"""A token that is a path: two or more slash-separated names ending in ``.py`` or ``/`` (a lone
``anthropic/`` is a folder named beside its parent, read in its sentence)."""


def named_paths(text: str) -> list[str]:
    """The paths in backticks of ``text`` (each backticked span split on ``, `` and spaces; a
    ``path.py::test`` or ``path.py:name`` reference counts as its file)."""
    found = []
    for span in re.findall(r"`([^`\n]+)`", text):
        for token in re.split(r"[\s,;()]+", span):
            token = re.split(r"::|:(?=\w)", token)[0]
            if PATH.match(token) and not token.startswith(("http", "/")):
                found.append(token)
    return found


def exists(path: str) -> bool:
    return any((ROOT / base / path).exists() for base in BASES)


def test_the_check_reads_paths_in_backticks() -> None:
    """``named_paths`` finds files and folders, short and long, and leaves other code alone."""
    text = "`exo_p2p/api/routes.py`, `api/generation/` and `tests/test_x.py::test_y`; `a.b` `x / y` `/exo-p2p/chunks/1` `ollama/`"
    assert named_paths(text) == ["exo_p2p/api/routes.py", "api/generation/", "tests/test_x.py"]
    assert exists("api/routes.py") and exists("engine/text.py") and not exists("api/nowhere.py")


def test_every_path_the_map_names_exists() -> None:
    missing = sorted({p for p in named_paths(PAGE.read_text()) if not exists(p)})
    assert missing == [], f"docs/architecture.md names paths that do not exist: {missing}"
