"""``worker/engine/answer/constraint.py`` may be imported by one thread and used by another: a
runner imports the engine's modules in a background thread (``worker/runner/startup.py``'s
preload) and steps the engine in its main thread. MLX streams belong to a thread, so a lazy
array the module made at import (on the importing thread's stream) cannot be evaluated by
another thread ("There is no Stream(cpu, N) in current thread"): every constrained request
of a real node failed that way. The module's source is run in a thread of its own here (a
fresh namespace, not ``sys.modules``) and its functions used from this one."""

from __future__ import annotations

import runpy
import threading

import mlx.core as mx
import numpy as np

import worker.engine.answer.constraint as constraint


def test_masks_unpack_in_another_thread_than_the_import() -> None:
    imported: dict = {}
    thread = threading.Thread(target=lambda: imported.update(runpy.run_path(constraint.__file__)))
    thread.start()
    thread.join(60)
    assert imported, "running the module's source failed"
    bits = mx.array(np.array([[5, -1]], dtype=np.int32))
    got = np.array(imported["unpack_bits"](bits, 40))
    assert got[0].tolist() == [True, False, True] + [False] * 29 + [True] * 8
