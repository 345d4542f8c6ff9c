"""What the runner process starts before its main loop: the background imports, the parent watch.

Both run on daemon threads started by ``worker.runner.main.main``.
"""

from __future__ import annotations

import os
import time

PRELOAD_MODULES = ("mlx.core", "worker.engine.loading.loader", "worker.engine.builder", "worker.runner.text_builder")
"""What a runner imports in the background from its start: MLX, mlx-lm and transformers
take ~1 s of CPU to import (over 10 s on a loaded machine), time that would otherwise come
after the lifecycle barriers (every rank created, every rank connected) instead of during
them — a re-placed 2-node instance spent 11-13 s between Connected and Loading under
scripts/chaos.py. ``load`` imports the same modules; Python's import locks make it wait
for an import still in flight rather than run it twice."""


def preload(modules: tuple[str, ...] = PRELOAD_MODULES) -> None:
    """Import ``modules`` (a failure is left for ``load`` to report, with its traceback)."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - reported by the lifecycle task that needs it
            return


def watch_parent(parent_pid: int, interval: float = 0.5) -> None:
    """Exit at once when the node process that started us is gone.

    The task pipe's end of file usually tells first (the reader thread exits then); this
    catches the rest. Linux's parent-death signal is not used: it fires when the *thread*
    that forked us exits, and trio forks from a worker thread that it retires when idle.
    """
    while True:
        time.sleep(interval)
        if os.getppid() != parent_pid:
            os._exit(0)
