"""Shard views: the directory a rank loads its shard from, hard links to a partial copy's files.

Views never point at a path that moves: a shard view is a directory of *hard links* to the
copy's files (the file itself, not its path), kept outside the copy in
``<root's parent>/.views/<root's name>/<view name>/``. So renaming a ``<path>.part`` to
``<path>`` when its last chunk arrives, and moving the whole copy elsewhere (a pull
promoting it to ``pulled/``), leave every view readable at its path: a running rank can
reload from it. A file system without hard links gets symlinks to the files' current paths
instead (logged), which a later rename breaks. Deleting a view frees no bytes while the copy
still holds its files; deleting the copy frees them only once its views are deleted too.

A view is built only when every chunk the shard needs is verified (``unverified_chunks``):
the holes of a ``.part`` file are never read by a rank that does not need them (mlx-lm maps
safetensors lazily and a rank evaluates only its own tensors).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

import structlog

from exo_p2p.models.names import check_relative_path
from exo_p2p.types.manifest import ModelManifest

VIEWS_DIR = ".views"
"""The dir next to a copy holding its shard views (module docstring)."""

log = structlog.get_logger(__name__)


def unverified_chunks(held: Mapping[str, set[int]], chunks: Mapping[str, Iterable[int]]) -> dict[str, list[int]]:
    """The chunks of ``chunks`` (path -> indices) not in ``held`` (path -> verified indices),
    sorted per path; paths with none are left out (pure)."""
    missing = {p: sorted(set(idx) - held.get(p, set())) for p, idx in chunks.items()}
    return {p: m for p, m in missing.items() if m}


def build_shard_view(root: Path, views_dir: Path, manifest: ModelManifest, held: Mapping[str, set[int]],
                     chunks: Mapping[str, Iterable[int]], name: str) -> Path:
    """``<views_dir>/<name>``, rebuilt: one hard link per manifest file of ``chunks`` (path ->
    indices), named as in the manifest, to the copy at ``root``'s complete file or its
    ``.part`` (``link_file``). ``held`` is the copy's verified chunks (path -> indices).

    Raises ``ValueError`` when a needed chunk is not in ``held``, or when ``name`` is not one
    plain path part (the view is deleted and rebuilt, so ``../..`` would delete a directory
    outside the copy); ``OSError`` when the files cannot be linked."""
    check_relative_path(name, "view name")
    if "/" in name:
        raise ValueError(f"view name {name!r} has a '/'")
    missing = unverified_chunks(held, chunks)
    if missing:
        some = ", ".join(f"{p}: {len(m)} chunks" for p, m in sorted(missing.items()))
        raise ValueError(f"shard not fully verified yet ({some})")
    view = views_dir / name
    shutil.rmtree(view, ignore_errors=True)
    view.mkdir(parents=True)
    for path in chunks:
        link = view / path
        link.parent.mkdir(parents=True, exist_ok=True)
        link_file(root, manifest, path, link)
    return view


def link_file(root: Path, manifest: ModelManifest, path: str, link: Path) -> None:
    """Hard-link manifest file ``path`` of the copy at ``root`` (complete, else its ``.part``
    grown to full length) at ``link``; a symlink where the file system has no hard links.
    Raises ``FileNotFoundError`` when neither is there (three tries: a concurrent fetch may
    rename the ``.part`` between two steps)."""
    final, part = root / path, root / f"{path}.part"
    size = manifest.file(path).size
    for _ in range(3):  # a concurrent fetch may rename the .part between two steps
        target = final if final.exists() else part
        try:
            if target is part and part.stat().st_size < size:
                os.truncate(part, size)  # a .part is sparse up to its last written chunk
            try:
                os.link(target, link)
            except OSError as exc:
                if isinstance(exc, FileNotFoundError):
                    raise
                log.warning("no hard links here: a shard view symlinks instead (it breaks when the "
                            "copy's files move)", path=str(target), error=str(exc))
                link.symlink_to(target.resolve())
            return
        except FileNotFoundError:
            continue
    raise FileNotFoundError(f"{final} (nor its .part) not found")
