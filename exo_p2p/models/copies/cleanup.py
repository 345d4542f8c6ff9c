"""Deleting a node's model copies under ``data_dir/models`` (layout: ``exo_p2p.models.depot.depot``).

What no copy owns in ``.fetched`` (``clean_fetched``), and a pulled copy with the shard views
made from it (``remove_pulled``). Blocking file-system work; which copies are open is the
depot's to say (it holds their lock).
"""

from __future__ import annotations

import shutil
from collections.abc import Set
from pathlib import Path

import msgspec
import structlog

from exo_p2p.models.copies.disk_room import DATA_DIR_RESERVE_BYTES, reclaimable
from exo_p2p.models.copies.files import MANIFEST_FILE
from exo_p2p.models.copies.shard_views import VIEWS_DIR
from exo_p2p.types.manifest import ModelManifest

log = structlog.get_logger(__name__)


def pulled_digests(pulled_dir: Path) -> set[str]:
    """Digests of the copies in ``pulled/NAME`` and ``pulled/ORG/NAME`` (their manifests
    moved with them on promotion); unreadable manifests are skipped."""
    out = set()
    for saved in [*pulled_dir.glob(f"*/{MANIFEST_FILE}"), *pulled_dir.glob(f"*/*/{MANIFEST_FILE}")]:
        try:
            out.add(msgspec.json.decode(saved.read_bytes(), type=ModelManifest).digest)
        except (OSError, ValueError, msgspec.DecodeError):
            continue
    return out


def clean_fetched(fetched_dir: Path, pulled_dir: Path, open_copies: Set[str]) -> list[Path]:
    """Delete, logging each, the dirs in ``fetched_dir`` that no copy owns; the deleted paths.

    - a ``.fetched/<name>/`` with no ``.manifest.json`` (every copy writes its manifest
      before any chunk): left by an ``rm`` that deleted a copy under a running fetch in an
      older version, which then wrote a chunk into a re-created dir; no ``rm`` finds it;
    - a ``.fetched/.views/<digest>/`` whose copy is neither in ``.fetched`` nor in
      ``pulled_dir`` (its hard links would hold the deleted copy's bytes).

    Never touched: a dir holding a manifest, a copy named in ``open_copies`` (digests the
    depot has open: a running fetch), the views of either or of a pulled copy."""
    removed = []
    for root in sorted(fetched_dir.iterdir()):
        if (root.name == VIEWS_DIR or root.name in open_copies or root.is_symlink() or not root.is_dir()
                or (root / MANIFEST_FILE).exists()):
            continue
        shutil.rmtree(root, ignore_errors=True)
        log.warning("removed a fetched copy with no manifest (left by an interrupted rm)", path=str(root))
        removed.append(root)
    views = fetched_dir / VIEWS_DIR
    if views.is_dir():
        kept = open_copies | pulled_digests(pulled_dir) | {
            r.name for r in fetched_dir.iterdir() if (r / MANIFEST_FILE).exists()}
        for view in sorted(views.iterdir()):
            if view.name not in kept:
                if view.is_dir() and not view.is_symlink():
                    shutil.rmtree(view, ignore_errors=True)
                else:
                    view.unlink()
                log.warning("removed the shard views of a deleted model copy", path=str(view))
                removed.append(view)
    return removed


def remove_pulled(pulled_dir: Path, fetched_dir: Path, name: str) -> list[Path]:
    """Delete the pulled copy ``pulled_dir/name`` (the caller checked ``name``), the shard
    views made from it (named by the digest of the manifest it moved with) and an emptied
    ``ORG`` of ``ORG/NAME``; the removed copy dir, or nothing when there is none. Raises
    ``OSError`` when the copy cannot be deleted."""
    target = pulled_dir / name
    if not target.is_dir():
        return []
    try:  # the manifest a pull moved with the copy names the views made before it
        digest = msgspec.json.decode((target / MANIFEST_FILE).read_bytes(), type=ModelManifest).digest
    except (OSError, ValueError, msgspec.DecodeError):
        digest = None
    shutil.rmtree(target)
    if digest is not None:
        shutil.rmtree(fetched_dir / VIEWS_DIR / digest, ignore_errors=True)
    if target.parent != pulled_dir and not any(target.parent.iterdir()):
        target.parent.rmdir()  # the emptied ORG of ORG/NAME
    return [target]


def reclaim_fetched(fetched_dir: Path, used: Set[str], free: int) -> list[Path]:
    """At start, with ``free`` bytes on the data dir's disk below
    ``disk_room.DATA_DIR_RESERVE_BYTES``: delete, logging each, the copies in ``fetched_dir``
    that are incomplete (a ``.part`` file left) and of a model no placement uses (``used``:
    model names of State's instances; ``disk_room.reclaimable``), with their shard views;
    the deleted dirs. Nothing when there is room. Blocking."""
    if free >= DATA_DIR_RESERVE_BYTES or not fetched_dir.is_dir():
        return []
    copies = []
    for root in sorted(fetched_dir.iterdir()):
        if root.name == VIEWS_DIR or root.is_symlink() or not (root / MANIFEST_FILE).is_file():
            continue
        try:
            name = msgspec.json.decode((root / MANIFEST_FILE).read_bytes(), type=ModelManifest).name
        except (OSError, ValueError, msgspec.DecodeError):
            continue
        copies.append((root.name, name, not any(root.rglob("*.part"))))
    removed = []
    for digest in reclaimable(copies, used):
        shutil.rmtree(fetched_dir / digest, ignore_errors=True)
        shutil.rmtree(fetched_dir / VIEWS_DIR / digest, ignore_errors=True)
        log.warning("data dir nearly full: removed a partial model copy no placement uses",
                    path=str(fetched_dir / digest), free_bytes=free, reserve_bytes=DATA_DIR_RESERVE_BYTES)
        removed.append(fetched_dir / digest)
    return removed


def reclaim_at_start(depot, used: Set[str]) -> list:  # type: ignore[no-untyped-def]
    """At a node's start, before anything writes: when the data dir's disk has less than
    ``DATA_DIR_RESERVE_BYTES`` free, remove ``depot``'s incomplete copies of models no
    placement uses (``used``; ``reclaim_fetched``) and say in the log what is
    free then; the removed dirs. Blocking."""
    data_dir = depot.models_dir.parent
    free = shutil.disk_usage(data_dir).free
    removed = reclaim_fetched(depot.fetched_dir, used, free)
    after = shutil.disk_usage(data_dir).free if removed else free
    if after < DATA_DIR_RESERVE_BYTES:
        log.error(
            "data dir nearly full: this node stops when its event log cannot be written (docs/security.md); "
            "free space on its disk", data_dir=str(data_dir), free_bytes=after,
            reserve_bytes=DATA_DIR_RESERVE_BYTES)
    return removed
