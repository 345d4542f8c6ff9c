"""The journal of a partial copy's verified chunks, and its record of whole-file checks.

``.verified`` holds one line ``"<chunk index> <path>"`` per verified chunk, appended at each
checkpoint (``exo_p2p.models.copies.partial``: the chunks' files are synced before their lines are
written, and the journal is fsync-ed after). A torn last line (a crash or a full disk
mid-append) is ignored when read, and the next append starts on a new line so the torn piece
never joins it: ``"1"`` + ``"5 f"`` would read as chunk 15 of ``f``.

``.checked`` holds one line ``"<path>"`` per complete file that passed its whole-file hash
(hub copies: ``exo_p2p.models.hub.manifest``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from exo_p2p.types.manifest import ModelManifest

JOURNAL = ".verified"
CHECKED = ".checked"
"""Complete files that passed their whole-file hash (hub copies: ``exo_p2p.models.hub.manifest``)."""


def journal_lines(chunks: Iterable[tuple[str, int]]) -> str:
    """The journal's lines for ``chunks`` (path, index), each ending in a newline (pure)."""
    return "".join(f"{i} {p}\n" for p, i in chunks)


def parse_journal(text: str, manifest: ModelManifest, present: Callable[[str], bool]) -> list[tuple[str, int]]:
    """The chunks (path, index) the journal ``text`` names, in its order: lines naming a
    manifest file and one of its chunks, whose file ``present(path)`` says is on disk; any
    other line (torn, or of another layout) is skipped."""
    out = []
    files = {f.path for f in manifest.files}
    for line in text.splitlines():
        index, _, name = line.partition(" ")
        if name in files and index.isdigit():
            entry = manifest.file(name)
            if int(index) < len(entry.chunks) and present(name):
                out.append((name, int(index)))
    return out


def ends_torn(journal: Path) -> bool:
    """Whether the journal file exists and its last line has no newline (a torn append)."""
    if not (journal.exists() and journal.stat().st_size > 0):
        return False
    with open(journal, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def without_file(text: str, path: str) -> str:
    """Journal ``text`` without the lines of file ``path``, each line ending in a newline (pure)."""
    lines = [ln for ln in text.splitlines() if ln.partition(" ")[2] != path]
    return "".join(f"{ln}\n" for ln in lines)


def replace_journal(journal: Path, text: str) -> None:
    """Replace the journal's contents by ``text`` (written beside it, then renamed over it)."""
    tmp = journal.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, journal)


def file_checked(root: Path, path: str) -> bool:
    """Whether complete file ``path`` of the copy at ``root`` passed its whole-file hash."""
    marks = root / CHECKED
    return marks.is_file() and path in marks.read_text(encoding="utf-8").splitlines()


def mark_checked(root: Path, path: str) -> None:
    """Record that complete file ``path`` of the copy at ``root`` passed its whole-file hash."""
    with open(root / CHECKED, "a", encoding="utf-8") as f:
        f.write(f"{path}\n")


def unmark_checked(root: Path, path: str) -> None:
    """Forget that file ``path`` passed its whole-file hash (its bytes are being discarded)."""
    marks = root / CHECKED
    if marks.is_file():
        kept = [p for p in marks.read_text(encoding="utf-8").splitlines() if p != path]
        marks.write_text("".join(f"{p}\n" for p in kept), encoding="utf-8")
