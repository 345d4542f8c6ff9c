"""The README is a first page whose two commands stay true: command 2 is what ``.ci/run``
runs, the page stays short, and every page it links exists (docs/testing.md)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
MAX_LINES = 200
"""The README's length bound: a first page; the rest lives in docs/."""


def _sh_blocks() -> list[str]:
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", README, re.S)]


def test_the_readme_starts_with_the_two_commands_and_ci_runs_command_2() -> None:
    first, second = _sh_blocks()[:2]
    assert first.startswith("bash scripts/install.sh && .venv/bin/exo-p2p run ")
    assert second.startswith("bash scripts/install.sh --test && .venv/bin/pytest ")
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("bash ")]
    assert ci_lines == [second], "README command 2 and .ci/run must be the same command"


def test_the_readme_is_a_first_page_and_its_links_exist() -> None:
    assert len(README.splitlines()) <= MAX_LINES
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README):
        assert (ROOT / target).exists(), f"README links {target}, which does not exist"
