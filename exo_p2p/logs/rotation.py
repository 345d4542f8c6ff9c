"""Bounded log files: a node's ``--log-file`` and the CLI's ``run-node.log`` rotate by size.

Both files are written by several processes at once through append-mode descriptors (the node,
its runners, which inherit the node's stdout/stderr, and C libraries writing to fd 2), so a
file cannot be renamed away under them: they would keep writing to the renamed one. Rotation
is therefore *copy and truncate*: the file's bytes are copied to ``<name>.1`` (replacing the
previous one) and the file is truncated to zero; every writer appends (``O_APPEND``), so its
next line lands at the new end. Lines written between the copy and the truncation are lost
(at most what the processes log in that moment), the price every copy-truncate rotation pays.

Bounds: ``NODE_LOG_MAX_BYTES`` for a node's log file, checked every ``CHECK_EVERY`` seconds
(so the file may pass it by what is logged meanwhile), and ``RUN_LOG_MAX_BYTES`` for
``run-node.log``, checked when ``exo-p2p run`` starts a node; with the ``.1`` copy a log takes
at most about twice its bound on disk. See docs/security.md.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

NODE_LOG_MAX_BYTES = 64 * 1024 * 1024
"""Bytes of a node's ``--log-file`` before it is rotated to ``<file>.1``."""
RUN_LOG_MAX_BYTES = 8 * 1024 * 1024
"""Bytes of the CLI's ``run-node.log`` before a run rotates it to ``run-node.log.1``."""
CHECK_EVERY = 10.0
"""Seconds between two size checks of a node's log file."""


def rotated_path(path: Path) -> Path:
    """Where the previous contents of ``path`` go: ``<path>.1``."""
    return path.with_name(path.name + ".1")


def rotate_if_larger(path: Path, limit: int) -> bool:
    """Copy ``path`` to ``rotated_path(path)`` and truncate it when it holds more than
    ``limit`` bytes; True when it did. A missing file, or ``limit`` ≤ 0, rotates nothing.
    Raises ``OSError`` when the copy or the truncation fails (the file is then unchanged or
    truncated with its copy complete: the copy is made first)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if limit <= 0 or size <= limit:
        return False
    shutil.copyfile(path, rotated_path(path))
    with open(path, "r+b") as f:
        f.truncate(0)
    return True


def watch(path: Path, limit: int = NODE_LOG_MAX_BYTES, every: float = CHECK_EVERY,
          stop: threading.Event | None = None) -> threading.Thread:
    """Start a daemon thread that calls ``rotate_if_larger(path, limit)`` every ``every``
    seconds until ``stop`` is set (never, by default: it ends with the process). An
    ``OSError`` (a full disk, the file's directory gone) is logged and the watch goes on."""
    stop = stop or threading.Event()

    def run() -> None:
        while not stop.wait(every):
            try:
                if rotate_if_larger(path, limit):
                    log.info("log rotated", file=str(path), limit=limit, to=str(rotated_path(path)))
            except OSError as exc:
                log.warning("log rotation failed", file=str(path), error=str(exc))

    thread = threading.Thread(target=run, name="log-rotation", daemon=True)
    thread.start()
    return thread
