"""Test-process setup: the optimised BLAS, as a runner has it (``worker/blas.py``).

A runner is started with the optimised BLAS preloaded (``LD_PRELOAD``); this process was
not, so it loads the same library with ``RTLD_GLOBAL`` before anything imports
``mlx.core`` (then MLX's ``cblas_*`` calls resolve to it), and rank processes a test starts
itself get ``LD_PRELOAD`` through ``blas.runner_environment`` (``rank_env``). Node processes
get it from their supervisor like in production. ``OPENBLAS_CORETYPE`` /
``OPENBLAS_L2_SIZE`` set by the machine are left as they are.
"""

from __future__ import annotations

import os
import sys

from worker import blas

BLAS_LIBRARY = blas.find_optimised_blas()
if "mlx.core" not in sys.modules and BLAS_LIBRARY is not None:
    _given = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = _given or str(blas.offered_cores())  # read once, at load
    blas.preload_in_process(BLAS_LIBRARY)
    if _given is None:
        del os.environ["OPENBLAS_NUM_THREADS"]


def rank_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a rank process started by a test: this one's, plus ``extra``, with
    the optimised BLAS preloaded as the supervisor does for a runner (one thread each, unless
    ``OPENBLAS_NUM_THREADS`` is set: several ranks share this machine's cores)."""
    return blas.runner_environment({**os.environ, **(extra or {})}, BLAS_LIBRARY, 1)
