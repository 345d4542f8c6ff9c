"""Shared test setup: the optimised BLAS, the bounds tests assert, and the fixtures many test
modules need (a models dir with a tiny synthetic model, a node with the embedded model placed).

The BLAS (``worker/blas.py``), as a runner has it:

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
from pathlib import Path

import pytest
import urllib3  # noqa: F401  (imported here, at collection: its import probes IPv6 by binding ::1,
# which inside a unit test's call would count as that test's socket; py-libp2p imports it
# through requests, lazily from ``exo_p2p.net``)
from hypothesis import HealthCheck, settings

from exo_p2p.limits import guard_setrlimit

guard_setrlimit()  # this process imports mlx-lm, which would lower its open-file limit and every node's it starts (exo_p2p.limits)

from tests.tiers import (  # noqa: F401  (the tier markers and their check: tests/tiers.py)
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_call,
    pytest_runtest_setup,
    pytest_runtest_teardown,
)
from tests.support import ast_retry
from worker import blas

ast_retry.install()  # the source-reading tests' parses survive CPython 3.11's converter race

# --- hypothesis profiles (docs/testing.md) ----------------------------------------------------------
# ``ci`` (CI=true, or HYPOTHESIS_PROFILE=ci) runs each property 100 times, ``dev`` 20 times;
# a test's own ``@settings(max_examples=...)`` wins over both. No deadline in either: the
# suite runs beside real node processes on 2 cores, where one example can take 10x its quiet
# time, and a deadline would fail a correct rule for the machine's load.
settings.register_profile(
    "ci", max_examples=100, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))

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


# --- bounds (docs/architecture.md#defaults, "Bounds the tests assert") ----------------------------
T_FAIL = 10.0
"""Seconds within which a request ends with an error after a node or runner process dies."""
T_LINK = 15.0
"""Seconds within which a request ends with an error after a link between ranks is reset, or
a node's whole link drops (it is timed out)."""
T_WEDGE = 50.0
"""Seconds within which a request ends with an error after only the ranks' ring link silently
drops (both ranks wedge in a collective, their nodes stay connected): a step stuck past
``RUNNER_STEP_FLOOR`` (45 s; ``worker.liveness``) and the kill."""
T_GONE = 5.0
"""Seconds without a heartbeat after which a peer is gone (``exo_p2p.defaults.PEER_TIMEOUT``)."""
NEW_MASTER = 5.0
"""Seconds within which a new master is agreed after the old one is gone."""

# --- models -----------------------------------------------------------------------------------------
TINY_MODEL = "tiny"
"""The synthetic model's id in the ``models_dir`` fixtures."""
EMBEDDED_MODEL = "smollm2-135m-instruct"
"""The real model every node can serve without downloads (slow on CPU: a handful of e2e tests)."""
STREAMING_MODEL = {"n_layers": 6, "hidden_size": 128, "intermediate_size": 256, "seed": 5}
"""Parameters of a tiny model slow enough on CPU that a long generation streams for seconds."""


def tiny_models_dir(tmp_path_factory, model: str = TINY_MODEL, **params) -> Path:  # type: ignore[no-untyped-def]
    """A fresh models dir holding one synthetic model ``model`` made with ``params``
    (``tests.support.models.synthetic_models.make_synthetic_model``)."""
    from tests.support.models.synthetic_models import make_synthetic_model

    directory = tmp_path_factory.mktemp("models")
    make_synthetic_model(directory / model, **params)
    return directory


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """A models dir with the streaming tiny model (``STREAMING_MODEL``); a module that needs
    another model defines its own ``models_dir`` with ``tiny_models_dir``."""
    return tiny_models_dir(tmp_path_factory, **STREAMING_MODEL)


@pytest.fixture(scope="module")
def embedded_node(tmp_path_factory):  # type: ignore[no-untyped-def]
    """One node process with the embedded model placed and ready (stopped at the end)."""
    from tests.support.cluster import NodeProcess

    node = NodeProcess(tmp_path_factory.mktemp("node"))
    try:
        node.start()
        node.place_and_wait(EMBEDDED_MODEL, timeout=300)
        yield node
    finally:
        node.stop()


# --- no process outlives its test module ---------------------------------------------------------
LEFTOVER_GRACE = 10.0
"""Seconds a module's processes get to exit after its last fixture is torn down (a node's
runner exits within ``T_FAIL`` of its node; the rest is slack for a loaded machine)."""
_ROOT = Path(__file__).resolve().parent.parent


def _ours_since(started: float) -> list:  # type: ignore[type-arg]
    """Live processes this pytest process started since ``started`` (epoch seconds): its
    descendants, plus orphans re-parented to init (a runner whose node was killed) that run
    this checkout's Python."""
    import psutil

    me = psutil.Process()
    found = {p.pid: p for p in me.children(recursive=True)}
    for proc in psutil.process_iter(["pid", "ppid", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if proc.info["ppid"] == 1 and cmd and cmd[0].startswith(f"{_ROOT}/"):
            found.setdefault(proc.pid, proc)
    alive = []
    for proc in found.values():
        try:
            if proc.create_time() >= started and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            pass
    return alive


@pytest.fixture(scope="module", autouse=True)
def no_leftover_processes():  # type: ignore[no-untyped-def]
    """Fails a module whose processes (nodes, runners, rank children) are still alive
    ``LEFTOVER_GRACE`` s after its fixtures are torn down, and kills them so the next module
    runs on a clean machine (autouse: set up first, so torn down after the module's fixtures)."""
    import time

    import psutil

    started = time.time() - 1.0  # create_time has a coarse clock
    yield
    deadline = time.monotonic() + LEFTOVER_GRACE
    left = _ours_since(started)
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = _ours_since(started)
    if not left:
        return
    described = []
    for proc in left:
        try:
            described.append(f"pid {proc.pid}: {' '.join(proc.cmdline())[:200]}")
            proc.kill()
        except psutil.Error:
            pass
    if described:
        pytest.fail("processes still running after the module ended (killed now):\n" + "\n".join(described))


@pytest.fixture()
def nodes():  # type: ignore[no-untyped-def]
    """A list a test appends the nodes it starts to; every one is stopped at the end
    (``tests.support.cluster.nodes_cleanup``)."""
    from tests.support.cluster import nodes_cleanup

    with nodes_cleanup([]) as listed:
        yield listed
