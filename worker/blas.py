"""The BLAS a runner's matmuls use, and the environment that makes a runner load it.

On Linux the ``mlx[cpu]`` wheel links the netlib *reference* BLAS it bundles
(``mlx_cpu.libs/libblas-*.so``; ``libmlx.so`` calls ``cblas_sgemm``): a float32 matmul then
runs at a few GFLOP/s. An optimised BLAS (OpenBLAS) named in ``LD_PRELOAD`` is searched
before the libraries ``libmlx.so`` depends on, so its ``cblas_*`` symbols take over for that
process only (measured on 2 cores: 512×512 float32 matmul 5.9 → 84 GFLOP/s). The supervisor
starts every runner with ``runner_environment``: ``LD_PRELOAD`` gets the library found by
``find_optimised_blas`` and ``OPENBLAS_NUM_THREADS`` the cores the node offers. Nothing else
of OpenBLAS's environment is touched (``OPENBLAS_CORETYPE``, ``OPENBLAS_L2_SIZE`` ... pass
through as they are: some machines set them for correctness).

macOS needs none of this (MLX uses Metal and Accelerate there): ``find_optimised_blas``
returns None and ``describe`` says so.
"""

from __future__ import annotations

import ctypes.util
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

INSTALL_COMMAND = "apt-get install -y libopenblas0-pthread"
"""How to install an optimised BLAS on Debian/Ubuntu (``scripts/install.sh`` runs it as root)."""

BLAS_ENV = "EXO_P2P_BLAS"
"""Environment variable naming the BLAS library file a runner preloads (overrides the
search; an empty value disables preloading)."""

_MULTIARCH = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu", "arm64": "aarch64-linux-gnu"}
_VARIANTS = ("openblas-pthread", "openblas-openmp", "openblas-serial", "")
_LIB_DIRS = ("/usr/lib/{triplet}", "/lib/{triplet}", "/usr/lib64", "/usr/lib", "/usr/local/lib")


def candidate_paths(machine: str | None = None) -> list[Path]:
    """Where an OpenBLAS ``libopenblas.so.0`` is looked for, in order: Debian/Ubuntu's
    ``/usr/lib/<triplet>/openblas-{pthread,openmp,serial}/`` (the pthread build first: it
    honours ``OPENBLAS_NUM_THREADS``), then the usual library directories."""
    triplet = _MULTIARCH.get(machine or platform.machine(), f"{machine or platform.machine()}-linux-gnu")
    out: list[Path] = []
    for template in _LIB_DIRS:
        base = Path(template.format(triplet=triplet))
        for variant in _VARIANTS:
            path = base / variant / "libopenblas.so.0" if variant else base / "libopenblas.so.0"
            if path not in out:
                out.append(path)
    return out


def find_optimised_blas(environ: Mapping[str, str] | None = None) -> Path | None:
    """The optimised BLAS a runner should preload, or None (not Linux, or none installed).

    ``$EXO_P2P_BLAS`` wins when set (empty: None; a path that does not exist: None); else
    the first existing ``candidate_paths()`` entry; else what ``ctypes.util.find_library
    ("openblas")`` finds (resolved in the linker cache)."""
    env = os.environ if environ is None else environ
    if BLAS_ENV in env:
        given = env[BLAS_ENV].strip()
        return Path(given) if given and Path(given).is_file() else None
    if platform.system() != "Linux":
        return None
    for path in candidate_paths():
        if path.is_file():
            return path
    name = ctypes.util.find_library("openblas")
    if name:
        for base in ("/usr/lib", "/lib", "/usr/local/lib", f"/usr/lib/{_MULTIARCH.get(platform.machine(), '')}"):
            path = Path(base) / name
            if path.is_file():
                return path
    return None


def offered_cores() -> int:
    """CPU cores this node offers its runners: the cores this process may run on
    (``sched_getaffinity``, so a cgroup or ``taskset`` limit counts), else ``os.cpu_count()``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def runner_environment(base: Mapping[str, str], blas: Path | None, threads: int) -> dict[str, str]:
    """The environment of a runner process: ``base`` plus, when ``blas`` is a library,
    ``blas`` prepended to ``LD_PRELOAD`` (kept once) and ``OPENBLAS_NUM_THREADS = threads``
    unless ``base`` already sets it. Every other variable (``OPENBLAS_CORETYPE``,
    ``OPENBLAS_L2_SIZE`` ...) is passed through unchanged."""
    env = dict(base)
    if blas is None:
        return env
    preload = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p and p != str(blas)]
    env["LD_PRELOAD"] = " ".join([str(blas), *preload])
    env.setdefault("OPENBLAS_NUM_THREADS", str(max(1, threads)))
    return env


def loaded_blas_libraries(pid: int | str = "self") -> list[str]:
    """The BLAS shared libraries mapped into process ``pid`` (paths from
    ``/proc/<pid>/maps`` whose file name contains "blas"), in first-seen order. Empty when
    ``/proc`` has no such process or cannot be read."""
    try:
        text = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return []
    seen: list[str] = []
    for line in text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and "blas" in Path(parts[5]).name and parts[5] not in seen:
            seen.append(parts[5])
    return seen


@dataclass(frozen=True)
class BlasChoice:
    """What this node's runners use: ``library`` (None: MLX's own, i.e. the reference BLAS on
    Linux or Accelerate on macOS), ``threads`` (``OPENBLAS_NUM_THREADS``), and a
    ``warning`` when a Linux node runs without an optimised BLAS (names the install command)."""

    library: Path | None
    threads: int
    warning: str | None = None


def choose(environ: Mapping[str, str] | None = None) -> BlasChoice:
    """This node's ``BlasChoice`` (see ``find_optimised_blas``)."""
    env = os.environ if environ is None else environ
    library = find_optimised_blas(env)
    threads = int(env["OPENBLAS_NUM_THREADS"]) if env.get("OPENBLAS_NUM_THREADS", "").isdigit() else offered_cores()
    warning = None
    if library is None and platform.system() == "Linux" and env.get(BLAS_ENV, None) != "":
        warning = (
            "no optimised BLAS found: runners use MLX's bundled reference BLAS and CPU inference is "
            f"~10-20x slower; install OpenBLAS (Debian/Ubuntu: sudo {INSTALL_COMMAND}, "
            "or run scripts/install.sh as root)"
        )
    return BlasChoice(library, threads, warning)


def preload_in_process(library: Path | None) -> bool:
    """Load ``library`` into this process with ``RTLD_GLOBAL`` so libraries loaded after it
    (``mlx.core``) resolve ``cblas_*`` to it, as ``LD_PRELOAD`` does for a new process. Must
    run before ``mlx.core`` is first imported; for scripts and the test process, which
    cannot be re-started with ``LD_PRELOAD``. Returns whether it was loaded."""
    if library is None:
        return False
    try:
        ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return False
    return True
